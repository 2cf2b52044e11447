-- A function of the scripts that store a response record (prepended to each by the store: response_put,
-- session_commit).

-- Stores the record `record` of response `id` in the session's responses hash `key`, drops the records of versions
-- older than `oldest` (the session no longer keeps them), and lets the hash expire with the session (`ttl_ms`;
-- none if not > 0).
local function put_response(key, id, record, oldest, ttl_ms)
    redis.call('HSET', key, id, record)
    for _, kept in ipairs(redis.call('HKEYS', key)) do
        local version = tonumber(string.match(kept, '%.(%d+)$'))
        if version and version < oldest then redis.call('HDEL', key, kept) end
    end
    if ttl_ms > 0 then redis.call('PEXPIRE', key, ttl_ms) end
end
