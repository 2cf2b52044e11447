-- KEYS[1] b:{response}, KEYS[2] be:{response}. ARGV: retention (ms), how many field/value pairs, the pairs, then
-- events to append. Each write keeps the job and its events for the retention from now.
local n = tonumber(ARGV[2])
for i = 3, 2 * n + 1, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
for i = 2 * n + 3, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[1]) end
return 1
