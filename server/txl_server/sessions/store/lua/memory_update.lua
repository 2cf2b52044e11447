-- KEYS[1] M:{id}, KEYS[2] Mv:{id}. ARGV: owner, ttl, n, n field/value pairs, block prefix. Changes the metadata of
-- the owner's memory and sets its TTL, which its blocks then live at least as long as. 1 done, 0 no such memory.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
write_fields(KEYS[1], 4, n, ttl)
redis.call('EXPIRE', KEYS[2], ttl)
local header = redis.call('HGET', KEYS[2], 'h:1')
if header then
    for _, block in ipairs(cjson.decode(header).blocks) do extend(ARGV[4 + 2 * n] .. block, ttl) end
end
return 1
