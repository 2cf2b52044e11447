-- KEYS[1] s:{id} (metadata), KEYS[2] m:{id}. ARGV: block prefix, expected version, ttl, then a version to write
-- (version, summary, header, hidden, keep, block id/data pairs). Replaces the stored versions with this one if the
-- metadata still holds `expected version` (a session leaving this process, persistence "evict"). {1} written, {0}
-- the session moved on or is gone (nothing written), {-3, id} a listed block is not stored.
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then return {0} end
drop_versions(KEYS[2], ARGV[1])
local missing = write_version_from(KEYS[2], ARGV[1], tonumber(ARGV[3]), 4, #ARGV)
if missing then return {-3, missing} end
return {1}
