-- KEYS[1] s:{id} (metadata), KEYS[2] m:{id} (stored versions), KEYS[3] l:{id} (optional: the lease, handed back).
-- ARGV: expected version, ttl, n, n field/value pairs, then mode ('keep' | 'drop' | 'write'); for 'drop': block
-- prefix; for 'write': block prefix, then a version to write (version, summary, header, hidden, keep, block id/data
-- pairs); with a lease, its token last. {1} committed, {-1} no such session, {-2} another writer committed first,
-- {-3, id} a listed block is not stored, {-4} the session is marked gone; nothing is written but with {1}.
local version = redis.call('HGET', KEYS[1], 'version')
if not version then return {-1} end
if tonumber(version) ~= tonumber(ARGV[1]) then return {-2} end
if redis.call('HGET', KEYS[1], 'tier') == 'gone' then return {-4} end
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local at = 4 + 2 * n
local mode = ARGV[at]
local last = #ARGV
if KEYS[3] then last = last - 1 end
if mode == 'write' then
    local missing = write_version_from(KEYS[2], ARGV[at + 1], ttl, at + 2, last)
    if missing then return {-3, missing} end
elseif mode == 'drop' then
    drop_versions(KEYS[2], ARGV[at + 1])
end
write_fields(KEYS[1], 4, n, ttl)
if KEYS[3] and redis.call('GET', KEYS[3]) == ARGV[#ARGV] then redis.call('DEL', KEYS[3]) end
return {1}
