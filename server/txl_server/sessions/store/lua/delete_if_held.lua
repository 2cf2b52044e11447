-- KEYS[1] a key its holder wrote (a lease, a heartbeat). ARGV: the holder's value. Deletes the key if it still
-- holds that value (never another holder's): 1 deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
