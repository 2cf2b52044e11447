-- KEYS[1] s:{id}. ARGV: tier. Records where the memory lives; a session marked gone stays gone.
local tier = redis.call('HGET', KEYS[1], 'tier')
if tier and tier ~= 'gone' then redis.call('HSET', KEYS[1], 'tier', ARGV[1]) end
return 0
