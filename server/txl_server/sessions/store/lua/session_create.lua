-- KEYS[1] s:{id}, KEYS[2] m:{id}, KEYS[3] t:{owner}. ARGV: ttl, id, n, n field/value pairs, then as
-- session_commit.lua's 'write' (or 'keep': no stored version). {1} created, {-3, id} a listed block is not stored
-- (nothing written).
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
local at = 4 + 2 * n
if ARGV[at] == 'write' then
    local blocks = {}
    for i = at + 7, #ARGV do table.insert(blocks, ARGV[i]) end
    local missing = write_version(KEYS[2], ARGV[at + 1], ttl, ARGV[at + 2], ARGV[at + 3], ARGV[at + 4],
        ARGV[at + 5], tonumber(ARGV[at + 6]), blocks)
    if missing then return {-3, missing} end
end
local fields = {}
for i = 1, 2 * n do fields[i] = ARGV[3 + i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('SADD', KEYS[3], ARGV[2])
return {1}
