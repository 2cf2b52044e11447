-- KEYS[1] m:{id}. ARGV: block prefix, ttl, version, header, hidden, written_at, max_age, then the ids of the
-- blocks new to the store. Settles a version committed ahead of its blocks (versions.lua's write_replay): its own
-- header, whose blocks are now in the block store, replaces the one it read (and its token ids to feed again), in
-- its blocks' reference counts too. {1} settled; {0} nothing to settle (the version is no longer kept, or was
-- settled); {-3, id} a listed block is not stored, {-6} the new blocks were written too long ago (nothing written).
local mkey, prefix, version, header = KEYS[1], ARGV[1], ARGV[3], ARGV[4]
if redis.call('HEXISTS', mkey, 'r:' .. version) == 0 then return {0} end
local blocks = {}
for i = 8, #ARGV do table.insert(blocks, ARGV[i]) end
local refused = check_blocks(prefix, header, ARGV[6], ARGV[7], blocks)
if refused then return refused end
local ttl = redis.call('TTL', mkey)
if ttl <= 0 then ttl = tonumber(ARGV[2]) end
-- Its blocks join those every kept version's blocks outlive (versions.lua's `t`).
local now = tonumber(redis.call('TIME')[1])
ttl = math.max(ttl, tonumber(redis.call('HGET', mkey, 't') or 0) - now)
local read = redis.call('HGET', mkey, 'h:' .. version)
count_references(prefix, ttl, header, blocks)  -- before the release: a block both list never drops to 0
release(prefix, read)
redis.call('HSET', mkey, 'h:' .. version, header)
if ARGV[5] ~= '' then redis.call('HSET', mkey, 'x:' .. version, ARGV[5]) end
redis.call('HDEL', mkey, 'r:' .. version)
for _, block in ipairs(cjson.decode(header).blocks) do extend(prefix .. block, ttl) end
return {1}
