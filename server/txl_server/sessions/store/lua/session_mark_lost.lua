-- KEYS[1] s:{id}. ARGV: ttl, reason, n, n field/value pairs (the metadata this server acknowledged). Records a
-- session the store lost (it came back without it) as gone for `reason`, for every replica, unless the session is
-- there again meanwhile: 1 recorded, 0 not.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
write_fields(KEYS[1], 4, tonumber(ARGV[3]), tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'tier', 'gone', 'gone', ARGV[2])
return 1
