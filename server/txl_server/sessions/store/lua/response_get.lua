-- KEYS[1] r:{session}, KEYS[2] s:{session}. ARGV: response id. The record while its session exists; the records'
-- TTL is brought up to the session's (a step outside the Responses API may have extended the session's).
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then
    redis.call('DEL', KEYS[1])
    return false
end
local record = redis.call('HGET', KEYS[1], ARGV[1])
if record and ttl > redis.call('PTTL', KEYS[1]) then redis.call('PEXPIRE', KEYS[1], ttl) end
return record
