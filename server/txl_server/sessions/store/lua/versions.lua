-- Functions of the scripts that write, list and drop stored versions (prepended to each of them by the store).
--
-- m:{id}      hash: one session's (or preloaded memory's) stored versions. `v` the newest version, `vs` the kept
--             versions' summaries (JSON, oldest first), `h:{version}` each kept version's header (JSON: its window
--             and the ids of its blocks in table order), `x:{version}` its last hidden state.
-- k:{block}   hash: one block's references, `n` how many kept versions list it (of any session or memory). Its
--             bytes are in the block store (sessions/blocks/), written before the version that first lists it; a
--             block an older server wrote keeps them here, in `d`, until they move (sessions/blocks/migration.py).
--
-- A block is released when no kept version lists it any more (its key deleted: the block store's sweeper then
-- collects its bytes); one whose referrers expired (Redis TTLs, no script runs) expires itself: a block's TTL is
-- kept at least that of every version listing it. Every function below runs inside one script, so a version and
-- its references are written, listed and dropped atomically. `prefix` is the block key prefix.

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

local function drop_versions(mkey, prefix)
    local fields = redis.call('HGETALL', mkey)
    for i = 1, #fields, 2 do
        if string.sub(fields[i], 1, 2) == 'h:' then release(prefix, fields[i + 1]) end
    end
    redis.call('DEL', mkey)
end

-- Writes one version: `blocks` the ids of the blocks new to the store (their bytes written at `written_at`, in
-- seconds since the epoch), `header` (JSON) lists every block it reads, new or already stored. Returns nil, or
-- the reply of a version it refused (nothing written then): {-3, id} a listed block is not stored (it expired),
-- {-6} the new blocks were written more than `max_age` seconds ago (the block store's sweeper may have collected
-- them, taking them for a crashed writer's: write them again).
local function write_version(mkey, prefix, ttl, version, summary, header, hidden, keep, written_at, max_age, blocks)
    if tonumber(redis.call('TIME')[1]) - tonumber(written_at) > tonumber(max_age) then return {-6} end
    local new = {}
    for _, block in ipairs(blocks) do new[block] = true end
    local listed = cjson.decode(header).blocks
    for _, block in ipairs(listed) do
        if not new[block] and redis.call('EXISTS', prefix .. block) == 0 then return {-3, block} end
    end
    if redis.call('HEXISTS', mkey, 'vs') == 0 then drop_versions(mkey, prefix) end  -- an older format: replaced
    for _, block in ipairs(blocks) do
        redis.call('HSET', prefix .. block, 'n', 0)
        redis.call('EXPIRE', prefix .. block, ttl)
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
    return nil
end

-- Writes the version ARGV holds from ARGV[at] on (version, summary, header, hidden, keep, written_at, max_age,
-- then the new blocks' ids up to ARGV[last]), as write_version does.
local function write_version_from(mkey, prefix, ttl, at, last)
    local blocks = {}
    for i = at + 7, last do table.insert(blocks, ARGV[i]) end
    return write_version(mkey, prefix, ttl, ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3],
        tonumber(ARGV[at + 4]), ARGV[at + 5], ARGV[at + 6], blocks)
end
