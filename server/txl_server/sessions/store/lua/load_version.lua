-- KEYS[1] m:{id}. ARGV: block prefix, version ('' = the newest). Returns {0} (no version in this format: nothing
-- stored, or an older format), {-1} (the version is not kept), {-2, id} (a block it lists is gone), else
-- {1, version, header, hidden, the token ids fed after the header's state (JSON) or '' (versions.lua: `r:`), then
-- per block its bytes if Redis still holds them (an older server's), else '' (they are in the block store)}.
local mkey = KEYS[1]
if redis.call('HEXISTS', mkey, 'vs') == 0 then return {0} end
local version = ARGV[2]
if version == '' then version = redis.call('HGET', mkey, 'v') end
local header = redis.call('HGET', mkey, 'h:' .. version)
if not header then return {-1} end
local out = {1, version, header, redis.call('HGET', mkey, 'x:' .. version) or '',
    redis.call('HGET', mkey, 'r:' .. version) or ''}
for _, block in ipairs(cjson.decode(header).blocks) do
    local key = ARGV[1] .. block
    if redis.call('EXISTS', key) == 0 then return {-2, block} end
    table.insert(out, redis.call('HGET', key, 'd') or '')
end
return out
