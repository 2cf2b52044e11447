-- Functions of the scripts that write, list and drop stored versions (prepended to each of them by the store).
--
-- m:{id}      hash: one session's (or preloaded memory's) stored versions. `v` the newest version, `vs` the kept
--             versions' summaries (JSON, oldest first), `h:{version}` each kept version's header (JSON: its window
--             and the ids of its blocks in table order), `x:{version}` its last hidden state. A version committed
--             ahead of its blocks (write-behind: sessions/persistence.py) has `r:{version}` too, the token ids fed
--             after the state its header holds (JSON): its state is that one advanced by them. Settling it
--             (settle_version) replaces its header with its own and drops `r:`.
-- k:{block}   hash: one block's references, `n` how many kept versions list it (of any session or memory). Its
--             bytes are in the block store (sessions/blocks/), written before the version that first lists it; a
--             block an older server wrote keeps them here, in `d`, until they move (sessions/blocks/migration.py).
--
-- A block is released when no kept version lists it any more (its key deleted: the block store's sweeper then
-- collects its bytes); one whose referrers expired (Redis TTLs, no script runs) expires itself: a block's TTL is
-- kept at least that of every version listing it. Every function below runs inside one script, so a version and
-- its references are written, listed and dropped atomically. `prefix` is the block key prefix.
--
-- `t` in m:{id}: the time (seconds since the epoch) until which every block a kept version lists lives at least.
-- A write that needs them `ttl` seconds more extends them one by one only when `t` falls short, and then by
-- EXTEND_MARGIN more: a session stepped every few seconds touches each of its blocks once in that margin, not at
-- every step (a chained turn's commit ran about 150 TTL calls). A block so outlives its last version by at most the
-- margin, and the sweeper then collects it within a minute (sessions/blocks/sweeper.py).

local function extend(key, ttl)  -- like EXPIRE ... GT on every Redis version: never shortens, never adds
    local left = redis.call('TTL', key)
    if left >= 0 and left < ttl then redis.call('EXPIRE', key, ttl) end
end

local EXTEND_MARGIN = 30

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

-- Nil if a version with `header` (JSON) may be written, its new blocks `blocks` written at `written_at`; else the
-- refusal: {-6} they were written more than `max_age` seconds ago, {-3, id} a listed block is not stored.
local function check_blocks(prefix, header, written_at, max_age, blocks)
    if tonumber(redis.call('TIME')[1]) - tonumber(written_at) > tonumber(max_age) then return {-6} end
    local new = {}
    for _, block in ipairs(blocks) do new[block] = true end
    for _, block in ipairs(cjson.decode(header).blocks) do
        if not new[block] and redis.call('EXISTS', prefix .. block) == 0 then return {-3, block} end
    end
    return nil
end

-- Counts a version with `header` among its blocks' referrers; `blocks` are new to the store (counted from 0).
local function count_references(prefix, ttl, header, blocks)
    for _, block in ipairs(blocks) do
        redis.call('HSET', prefix .. block, 'n', 0)
        redis.call('EXPIRE', prefix .. block, ttl)
    end
    for _, block in ipairs(cjson.decode(header).blocks) do redis.call('HINCRBY', prefix .. block, 'n', 1) end
end

-- Writes one version: `blocks` the ids of the blocks new to the store (their bytes written at `written_at`, in
-- seconds since the epoch), `header` (JSON) lists every block it reads, new or already stored. Returns nil, or
-- the reply of a version it refused (nothing written then): {-3, id} a listed block is not stored (it expired),
-- {-6} the new blocks were written more than `max_age` seconds ago (the block store's sweeper may have collected
-- them, taking them for a crashed writer's: write them again).
local function write_version(mkey, prefix, ttl, version, summary, header, hidden, keep, written_at, max_age, blocks,
                             replay, shared)
    if not shared then  -- `shared`: `header` is a kept version's (write_replay), so its blocks are stored
        local refused = check_blocks(prefix, header, written_at, max_age, blocks)
        if refused then return refused end
    end
    if redis.call('HEXISTS', mkey, 'vs') == 0 then drop_versions(mkey, prefix) end  -- an older format: replaced
    local now = tonumber(redis.call('TIME')[1])
    local covered = tonumber(redis.call('HGET', mkey, 't') or 0)
    local extending = covered < now + ttl
    if extending then covered = now + ttl + EXTEND_MARGIN end
    count_references(prefix, covered - now, header, blocks)
    redis.call('HSET', mkey, 'h:' .. version, header, 'v', version)
    if replay and replay ~= '' then
        redis.call('HSET', mkey, 'r:' .. version, replay)
    else
        redis.call('HDEL', mkey, 'r:' .. version)
    end
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
        redis.call('HDEL', mkey, 'h:' .. old.version, 'x:' .. old.version, 'r:' .. old.version)
    end
    redis.call('HSET', mkey, 'vs', cjson.encode(kept))
    redis.call('EXPIRE', mkey, ttl)
    if extending then
        -- Versions share most blocks (and those ahead of their blocks, their whole header): each block once.
        local headers, blocks_seen = {}, {}
        for _, entry in ipairs(kept) do
            local kept_header = redis.call('HGET', mkey, 'h:' .. entry.version)
            if kept_header and not headers[kept_header] then
                headers[kept_header] = true
                for _, block in ipairs(cjson.decode(kept_header).blocks) do
                    if not blocks_seen[block] then
                        blocks_seen[block] = true
                        extend(prefix .. block, covered - now)
                    end
                end
            end
        end
        redis.call('HSET', mkey, 't', covered)
    elseif not shared then
        -- Its header may list blocks only another session's versions kept (a fork's): they must live as long.
        for _, block in ipairs(cjson.decode(header).blocks) do extend(prefix .. block, covered - now) end
    end
    return nil
end

-- Writes the version ARGV holds from ARGV[at] on (version, summary, header, hidden, keep, written_at, max_age,
-- the token ids fed after the header's state or '' (a new session's first version ahead of its blocks), then the
-- new blocks' ids up to ARGV[last]), as write_version does.
local function write_version_from(mkey, prefix, ttl, at, last)
    local blocks = {}
    for i = at + 8, last do table.insert(blocks, ARGV[i]) end
    return write_version(mkey, prefix, ttl, ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3],
        tonumber(ARGV[at + 4]), ARGV[at + 5], ARGV[at + 6], blocks, ARGV[at + 7])
end

-- Writes `version` ahead of its blocks (write-behind): the state of `previous` (a kept version) advanced by the
-- token ids `tokens` (JSON), which bring it to `fed` positions fed. Its header is the one `previous` reads (a
-- settled version's own, or the one a version still ahead of its blocks reads), so it lists, and counts, blocks
-- already stored; `r:{version}` holds every token fed after that header's state. Returns nil, or {-7} (nothing
-- written: write the version with its blocks) if `previous` is not kept, the tokens do not bring its state to
-- `fed`, or more than `max_tokens` would have to be fed again to read it back.
local function write_replay(mkey, prefix, ttl, previous, version, summary, tokens, fed, keep, max_tokens)
    local header = redis.call('HGET', mkey, 'h:' .. previous)
    if not header or redis.call('HEXISTS', mkey, 'vs') == 0 then return {-7} end
    local replay = {}
    local before = redis.call('HGET', mkey, 'r:' .. previous)
    if before then replay = cjson.decode(before) end
    for _, token in ipairs(cjson.decode(tokens)) do table.insert(replay, token) end
    if #replay == 0 or #replay > tonumber(max_tokens) then return {-7} end
    local base = tonumber(cjson.decode(header).fed)
    if not base or base + #replay ~= tonumber(fed) then return {-7} end
    return write_version(mkey, prefix, ttl, version, summary, header, '', keep, redis.call('TIME')[1], 1, {},
        cjson.encode(replay), true)
end

-- Writes the version ARGV holds from ARGV[at] on, ahead of its blocks (previous version, version, summary, token
-- ids, fed, keep, max_tokens), as write_replay does.
local function write_replay_from(mkey, prefix, ttl, at)
    return write_replay(mkey, prefix, ttl, ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4],
        tonumber(ARGV[at + 5]), ARGV[at + 6])
end
