-- KEYS[1] M:{id}, KEYS[2] Mv:{id}, KEYS[3] Mi:{owner}. ARGV: ttl, id, n, n field/value pairs, block prefix, then a
-- version to write (version, summary, header, hidden, keep, written_at, max_age, '' (no tokens to feed again: a
-- memory is written with its blocks), new block ids): a memory never
-- changes, so it is written as version 1, kept alone. {1} created, {-3, id} a listed block is not stored, {-6} its
-- new blocks were written too long ago (write them again); nothing is written but with {1}.
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
local at = 4 + 2 * n
local blocks = {}
for i = at + 9, #ARGV do table.insert(blocks, ARGV[i]) end
local refused = write_version(KEYS[2], ARGV[at], ttl, '1', ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], 1,
    ARGV[at + 6], ARGV[at + 7], blocks)
if refused then return refused end
write_fields(KEYS[1], 4, n, ttl)
redis.call('SADD', KEYS[3], ARGV[2])
return {1}
