"""Redis-side code for stored memories: versions that list blocks shared by reference (engine/blocks.py).

Keys (under the store's prefix):
    m:{id}      hash: one session's (or preloaded memory's) stored memory. `v` the newest version, `vs` the kept
                versions' summaries (JSON, oldest first), `h:{version}` each kept version's header (JSON: its
                window and the ids of its blocks in table order), `x:{version}` its last hidden state.
    k:{block}   hash: one block, `d` its data and `n` how many kept versions list it (of any session or memory).

A block is deleted when no kept version lists it any more; one whose referrers expired (Redis TTLs, no script
runs) expires itself: a block's TTL is kept at least that of every memory listing it. Every function below runs
inside one script, so a version and its blocks are written, listed and dropped atomically.
"""

from __future__ import annotations

# Functions shared by the scripts that write memories (commit, create, save). `prefix` is the block key prefix.
FUNCTIONS = """
local function extend(key, ttl)  -- like EXPIRE ... GT on every Redis version: never shortens, never adds
    local left = redis.call('TTL', key)
    if left >= 0 and left < ttl then redis.call('EXPIRE', key, ttl) end
end

local function release(prefix, header)
    for _, block in ipairs(cjson.decode(header).blocks) do
        local key = prefix .. block
        if redis.call('HINCRBY', key, 'n', -1) <= 0 then redis.call('DEL', key) end
    end
end

local function drop_memory(mkey, prefix)
    local fields = redis.call('HGETALL', mkey)
    for i = 1, #fields, 2 do
        if string.sub(fields[i], 1, 2) == 'h:' then release(prefix, fields[i + 1]) end
    end
    redis.call('DEL', mkey)
end

-- Writes one version: `blocks` the new blocks' id/data pairs, `header` (JSON) lists every block it reads, new or
-- already stored. Returns the id of a listed block the store does not hold (nothing written then), or false.
local function write_version(mkey, prefix, ttl, version, summary, header, hidden, keep, blocks)
    local new = {}
    for i = 1, #blocks, 2 do new[blocks[i]] = true end
    local listed = cjson.decode(header).blocks
    for _, block in ipairs(listed) do
        if not new[block] and redis.call('EXISTS', prefix .. block) == 0 then return block end
    end
    if redis.call('HEXISTS', mkey, 'vs') == 0 then drop_memory(mkey, prefix) end  -- an older format: replaced
    for i = 1, #blocks, 2 do
        redis.call('HSET', prefix .. blocks[i], 'd', blocks[i + 1], 'n', 0)
        redis.call('EXPIRE', prefix .. blocks[i], ttl)
    end
    for _, block in ipairs(listed) do redis.call('HINCRBY', prefix .. block, 'n', 1) end
    redis.call('HSET', mkey, 'h:' .. version, header, 'v', version)
    if hidden ~= '' then redis.call('HSET', mkey, 'x:' .. version, hidden) end
    local kept = {}
    local raw = redis.call('HGET', mkey, 'vs')
    if raw then kept = cjson.decode(raw) end
    local this = cjson.decode(summary)
    local fresh = {}
    for _, entry in ipairs(kept) do
        if tostring(entry.version) ~= tostring(this.version) then table.insert(fresh, entry) end
    end
    kept = fresh
    table.insert(kept, this)
    while #kept > keep do
        local old = table.remove(kept, 1)
        local old_header = redis.call('HGET', mkey, 'h:' .. old.version)
        if old_header then release(prefix, old_header) end
        redis.call('HDEL', mkey, 'h:' .. old.version, 'x:' .. old.version)
    end
    redis.call('HSET', mkey, 'vs', cjson.encode(kept))
    redis.call('EXPIRE', mkey, ttl)
    for _, entry in ipairs(kept) do
        local kept_header = redis.call('HGET', mkey, 'h:' .. entry.version)
        if kept_header then
            for _, block in ipairs(cjson.decode(kept_header).blocks) do extend(prefix .. block, ttl) end
        end
    end
    return false
end
"""

# KEYS[1] m:{id}. ARGV: block prefix, version ('' = the newest). Returns {0} (no memory in this format: nothing
# stored, or an older format), {-1} (the version is not kept), {-2, id} (a block it lists is gone), else
# {1, version, header, hidden, block data...}.
LOAD = """
local mkey = KEYS[1]
if redis.call('HEXISTS', mkey, 'vs') == 0 then return {0} end
local version = ARGV[2]
if version == '' then version = redis.call('HGET', mkey, 'v') end
local header = redis.call('HGET', mkey, 'h:' .. version)
if not header then return {-1} end
local out = {1, version, header, redis.call('HGET', mkey, 'x:' .. version) or ''}
for _, block in ipairs(cjson.decode(header).blocks) do
    local data = redis.call('HGET', ARGV[1] .. block, 'd')
    if not data then return {-2, block} end
    table.insert(out, data)
end
return out
"""

# KEYS[1] the metadata hash, KEYS[2] m:{id}. ARGV: block prefix, expected version, ttl, version, summary, header,
# hidden, keep, then block id/data pairs. Replaces the stored memory with one version if the metadata still holds
# `expected version` (a session leaving this process, persistence "evict"). {1} written, {0} the session moved
# on or is gone (nothing written), {-3, id} a listed block is not stored.
SAVE = (
    FUNCTIONS
    + """
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then return {0} end
local blocks = {}
for i = 9, #ARGV do table.insert(blocks, ARGV[i]) end
drop_memory(KEYS[2], ARGV[1])
local missing = write_version(KEYS[2], ARGV[1], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], ARGV[7],
    tonumber(ARGV[8]), blocks)
if missing then return {-3, missing} end
return {1}
"""
)

# KEYS[1] m:{id}. ARGV: block prefix. Drops a stored memory and its references to its blocks.
DROP = (
    FUNCTIONS
    + """
drop_memory(KEYS[1], ARGV[1])
return 1
"""
)
