-- KEYS[1] s:{id}, KEYS[2] m:{id}. ARGV: version, reason, the owner index's key prefix, id, block prefix. Marks
-- the session gone if it is still at that version (a commit since means someone holds its memory after all).
local version = redis.call('HGET', KEYS[1], 'version')
if not version or tonumber(version) ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'tier', 'gone', 'gone', ARGV[2])
drop_versions(KEYS[2], ARGV[5])
redis.call('SREM', ARGV[3] .. redis.call('HGET', KEYS[1], 'owner'), ARGV[4])
return 1
