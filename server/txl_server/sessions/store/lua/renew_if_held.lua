-- KEYS[1] a key its holder wrote (a lease, an idempotency claim). ARGV: the holder's value, ms. Extends the key's
-- life if it still holds that value: 1 renewed, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
