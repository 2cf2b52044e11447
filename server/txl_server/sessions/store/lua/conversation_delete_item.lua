-- KEYS[1] c:{session}, KEYS[2] ci:{session}. ARGV: an item's id. Deletes the item if the memory has not read it:
-- 1 deleted, 0 no such item, -1 the memory read it already (nothing changed).
local fed = tonumber(redis.call('HGET', KEYS[1], 'fed') or '0')
local items = redis.call('LRANGE', KEYS[2], 0, -1)
for i, raw in ipairs(items) do
    if cjson.decode(raw)['id'] == ARGV[1] then
        if i <= fed then return -1 end
        redis.call('LREM', KEYS[2], 1, raw)
        return 1
    end
end
return 0
