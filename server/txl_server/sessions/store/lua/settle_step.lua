-- KEYS[1] s:{id}, KEYS[2] l:{id}. ARGV: kind ('commit': a create or a commit | 'delete'), op (the step's id), the
-- step's lease token. Settles a change whose reply was lost: whether it was applied, and if it was not, makes sure
-- it never will be (each such change needs its lease, which is handed back here if the step still holds it).
-- {1, version} applied (a deletion: {1, 0}), {0} not applied, and fenced off.
local applied = nil
if ARGV[1] == 'delete' then
    if redis.call('EXISTS', KEYS[1]) == 0 then applied = 0 end
else
    local ops = redis.call('HGET', KEYS[1], 'ops')
    if ops then
        for entry in string.gmatch(ops, '[^,]+') do
            local id, version = string.match(entry, '^(.-)=(%d+)$')
            if id == ARGV[2] then applied = tonumber(version) end
        end
    end
end
if applied then return {1, applied} end
if redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
return {0}
