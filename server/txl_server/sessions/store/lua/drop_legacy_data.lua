-- KEYS: k:{block} of blocks whose bytes an older server kept in Redis (field `d`), now written to the block store.
-- Drops those bytes from Redis where the block is still referenced; how many it dropped.
local dropped = 0
for _, key in ipairs(KEYS) do
    dropped = dropped + redis.call('HDEL', key, 'd')
end
return dropped
