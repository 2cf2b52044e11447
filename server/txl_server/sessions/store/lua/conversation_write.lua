-- KEYS[1] c:{session}, KEYS[2] ci:{session}, KEYS[3] s:{session}. ARGV: how many field/value pairs, the pairs,
-- whether every item is then read by the memory (1: `fed` becomes the number of items), then items to append.
-- Both keys live as long as the session: 0 (nothing written) if it is gone, else the number of items.
local ttl = redis.call('PTTL', KEYS[3])
if ttl == -2 then
    redis.call('DEL', KEYS[1], KEYS[2])
    return 0
end
local n = tonumber(ARGV[1])
for i = 2, 2 * n, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
local count = redis.call('LLEN', KEYS[2])
for i = 2 * n + 3, #ARGV do count = redis.call('RPUSH', KEYS[2], ARGV[i]) end
if ARGV[2 * n + 2] == '1' then redis.call('HSET', KEYS[1], 'fed', count) end
if ttl > 0 then
    redis.call('PEXPIRE', KEYS[1], ttl)
    if count > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return math.max(count, 1)
