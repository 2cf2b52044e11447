-- KEYS[1] s:{id}, KEYS[2] m:{id}, KEYS[3] t:{owner}. ARGV: ttl, id, n, n field/value pairs, then as
-- session_commit.lua's 'write' (or 'keep': no stored version). {1} created, {-3, id} a listed block is not stored
-- (nothing written).
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
local at = 4 + 2 * n
if ARGV[at] == 'write' then
    local missing = write_version_from(KEYS[2], ARGV[at + 1], ttl, at + 2, #ARGV)
    if missing then return {-3, missing} end
end
write_fields(KEYS[1], 4, n, ttl)
redis.call('SADD', KEYS[3], ARGV[2])
return {1}
