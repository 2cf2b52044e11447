-- KEYS[1] r:{session}, KEYS[2] s:{session}. ARGV: response id, record, the oldest version the session keeps.
-- 0 if the session is gone (nothing written).
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then return 0 end
put_response(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ttl)
return 1
