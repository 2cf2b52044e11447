-- KEYS[1] r:{session}, KEYS[2] s:{session}. ARGV: response id, record, the oldest version the session keeps.
-- 0 if the session is gone (nothing written).
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local oldest = tonumber(ARGV[3])
for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    local version = tonumber(string.match(id, '%.(%d+)$'))
    if version and version < oldest then redis.call('HDEL', KEYS[1], id) end
end
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
