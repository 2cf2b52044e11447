-- KEYS[1] s:{id}, KEYS[2] m:{id}, KEYS[3] t:{owner}, KEYS[4] l:{id} (the new session's lease, taken when its id
-- was reserved: session_reserve.lua), KEYS[5] the store's identity (its commit count), KEYS[6] (optional) an
-- Idempotency-Key's record. ARGV: ttl, id, lease token,
-- op (the step's id), receipt record, receipt ttl, n, n field/value pairs, then as session_commit.lua's 'write'
-- (or 'keep': no stored version).
-- {1, the store's commit count} created, {-3, id} a listed block is not stored, {-6} the new blocks were written
-- too long ago, {-5} the lease is no longer the create's (it expired, or the create's outcome was settled as not
-- applied: a late arrival is fenced off); nothing is written but with {1}.
if redis.call('GET', KEYS[4]) ~= ARGV[3] then return {-5} end
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[7])
local at = 8 + 2 * n
if ARGV[at] == 'write' then
    local refused = write_version_from(KEYS[2], ARGV[at + 1], ttl, at + 2, #ARGV)
    if refused then return refused end
end
write_fields(KEYS[1], 8, n, ttl)
note_op(KEYS[1], ARGV[4], redis.call('HGET', KEYS[1], 'version'))
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[4])
write_receipt(KEYS[6], ARGV[5], ARGV[6])
return {1, redis.call('HINCRBY', KEYS[5], 'commits', 1)}
