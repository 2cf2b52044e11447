-- KEYS[1] s:{id}, KEYS[2] l:{id}, KEYS[3] r:{id} (its stored responses). ARGV: owner, lease token, lease ms, a
-- response id the session must still hold ('' none: a chained turn's previous response this process knows,
-- checked here rather than read first). The session's metadata under a new lease, in one round trip: {-1} no such
-- session of this owner (checked first: a foreign session's lease is never touched, so 404 comes before 409), {-3}
-- it no longer holds that response (deleted), {-2} another writer holds the lease, else {1, field, value, ...}.
local meta = redis.call('HGETALL', KEYS[1])
if #meta == 0 then return {-1} end
local owner = nil
for i = 1, #meta, 2 do if meta[i] == 'owner' then owner = meta[i + 1] end end
if owner ~= ARGV[1] then return {-1} end
if ARGV[4] ~= '' and redis.call('HEXISTS', KEYS[3], ARGV[4]) == 0 then return {-3} end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return {-2} end
table.insert(meta, 1, 1)
return meta
