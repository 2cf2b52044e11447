-- KEYS[1] c:{session}, KEYS[2] ci:{session}, KEYS[3] s:{session}. The conversation's fields and its items while
-- its session exists (their TTL brought up to the session's), else nothing (and they are deleted).
local ttl = redis.call('PTTL', KEYS[3])
if ttl == -2 then
    redis.call('DEL', KEYS[1], KEYS[2])
    return false
end
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return false end
if ttl > redis.call('PTTL', KEYS[1]) then
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
end
return {fields, redis.call('LRANGE', KEYS[2], 0, -1)}
