-- KEYS[1] s:{id} (metadata), KEYS[2] m:{id}. ARGV: block prefix, expected version, ttl, then a version to write
-- (as versions.lua's write_version_from takes it). Replaces the stored versions with this one if the metadata
-- still holds `expected version` (a session leaving this process, persistence "evict"). {1} written, {0} the
-- session moved on or is gone (nothing written), {-3, id} a listed block is not stored, {-6} the new blocks were
-- written too long ago.
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then return {0} end
drop_versions(KEYS[2], ARGV[1])
local refused = write_version_from(KEYS[2], ARGV[1], tonumber(ARGV[3]), 4, #ARGV)
if refused then return refused end
return {1}
