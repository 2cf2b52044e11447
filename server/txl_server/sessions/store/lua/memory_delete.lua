-- KEYS[1] M:{id}, KEYS[2] Mv:{id}, KEYS[3] Mi:{owner}. ARGV: owner, block prefix, id. 1 deleted, 0 no such memory.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
drop_versions(KEYS[2], ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[3])
return 1
