-- A function of the scripts that write a session's or a memory's metadata (prepended to each by the store).

-- Sets the `n` field/value pairs ARGV holds from ARGV[first] on in the hash `key`, which then expires in `ttl` s.
local function write_fields(key, first, n, ttl)
    local fields = {}
    for i = 1, 2 * n do fields[i] = ARGV[first + i - 1] end
    redis.call('HSET', key, unpack(fields))
    redis.call('EXPIRE', key, ttl)
end

-- Records that the step `op` (a random id) made version `version` of the session whose metadata is at `key`,
-- among the last few steps' ids: a step whose commit got no answer learns from them whether it was applied
-- (settle_step.lua), even if another step committed after it.
local function note_op(key, op, version)
    local kept = {op .. '=' .. version}
    local old = redis.call('HGET', key, 'ops')
    if old then
        for entry in string.gmatch(old, '[^,]+') do
            if #kept < 4 then table.insert(kept, entry) end
        end
    end
    redis.call('HSET', key, 'ops', table.concat(kept, ','))
end

-- Writes an Idempotency-Key's record (the change's answer) in the script that makes the change, when one is given
-- (`key` false: none): a retry finds the answer even if the change's own reply was lost.
local function write_receipt(key, record, ttl)
    if key then redis.call('SET', key, record, 'EX', ttl) end
end
