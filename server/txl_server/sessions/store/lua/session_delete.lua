-- KEYS[1] s:{id}, KEYS[2] m:{id}, KEYS[3] l:{id}, KEYS[4] t:{owner}. ARGV: block prefix, id.
drop_versions(KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
return 1
