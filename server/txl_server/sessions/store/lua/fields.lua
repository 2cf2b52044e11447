-- A function of the scripts that write a session's or a memory's metadata (prepended to each by the store).

-- Sets the `n` field/value pairs ARGV holds from ARGV[first] on in the hash `key`, which then expires in `ttl` s.
local function write_fields(key, first, n, ttl)
    local fields = {}
    for i = 1, 2 * n do fields[i] = ARGV[first + i - 1] end
    redis.call('HSET', key, unpack(fields))
    redis.call('EXPIRE', key, ttl)
end
