-- KEYS[1] s:{id} (metadata), KEYS[2] m:{id} (stored versions), KEYS[3] l:{id} (the step's lease, handed back),
-- KEYS[4] the store's identity (its commit count), KEYS[5] r:{id} (its stored responses), KEYS[6] (optional) an
-- Idempotency-Key's record. ARGV: expected version, ttl, lease token, op (the step's id), receipt record, receipt
-- ttl, response id ('' none: the turn's response record, stored with the commit), its record, the oldest version
-- kept, n, n field/value pairs, then mode ('keep' | 'drop' | 'write' | 'replay'); for
-- 'drop': block prefix; for 'write': block prefix, then a version to write (version, summary, header, hidden, keep,
-- written_at, max_age, the ids of the blocks new to the store: versions.lua); for 'replay': block prefix, then a
-- version to write ahead of its blocks (previous version, version, summary, token ids, fed, keep, max_tokens:
-- versions.lua's write_replay).
-- {1, the store's commit count} committed, {-1} no such session, {-2} another writer committed first, {-3, id} a
-- listed block is not stored, {-6} the new blocks were written too long ago, {-7} the version cannot be written
-- ahead of its blocks (write it with them), {-4} the session is marked gone, {-5} the lease is no longer the step's: it expired, another writer took it, or
-- the step's outcome was settled as not applied (settle_step.lua): a late commit is fenced off. Nothing is written
-- but with {1}.
local version = redis.call('HGET', KEYS[1], 'version')
if not version then return {-1} end
if redis.call('HGET', KEYS[1], 'tier') == 'gone' then return {-4} end
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return {-5} end
if tonumber(version) ~= tonumber(ARGV[1]) then return {-2} end
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[10])
local at = 11 + 2 * n
local mode = ARGV[at]
if mode == 'write' then
    local refused = write_version_from(KEYS[2], ARGV[at + 1], ttl, at + 2, #ARGV)
    if refused then return refused end
elseif mode == 'replay' then
    local refused = write_replay_from(KEYS[2], ARGV[at + 1], ttl, at + 2)
    if refused then return refused end
elseif mode == 'drop' then
    drop_versions(KEYS[2], ARGV[at + 1])
end
write_fields(KEYS[1], 11, n, ttl)
note_op(KEYS[1], ARGV[4], redis.call('HGET', KEYS[1], 'version'))
redis.call('DEL', KEYS[3])
write_receipt(KEYS[6], ARGV[5], ARGV[6])
if ARGV[7] ~= '' then put_response(KEYS[5], ARGV[7], ARGV[8], tonumber(ARGV[9]), ttl * 1000) end
return {1, redis.call('HINCRBY', KEYS[4], 'commits', 1)}
