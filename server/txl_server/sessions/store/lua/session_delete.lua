-- KEYS[1] s:{id}, KEYS[2] m:{id}, KEYS[3] l:{id} (the deletion's lease), KEYS[4] t:{owner}, KEYS[5] d:{id} (the
-- deleted mark), KEYS[6] (optional) an Idempotency-Key's record. ARGV: block prefix, id, lease token, receipt
-- record, receipt ttl. The deleted mark lives as long as the session would have: a replica that acknowledged it
-- then knows it was deleted, not lost by the store (sessions/acked.py).
-- {1} deleted, {-5} the lease is no longer the deletion's (fenced off, as in session_commit.lua): nothing deleted.
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return {-5} end
local ttl = redis.call('PTTL', KEYS[1])
drop_versions(KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
if ttl > 0 then redis.call('SET', KEYS[5], '1', 'PX', ttl) end
write_receipt(KEYS[6], ARGV[4], ARGV[5])
return {1}
