-- KEYS[1] t:{owner}, KEYS[2] l:{id}. ARGV: id, the owner's session limit, lease token, lease ms. Reserves a new
-- session's id under the owner's limit, exactly under concurrency (the count and the reservation are one step),
-- and takes the new session's lease for its create (session_create.lua): 1 reserved, 0 the index is full (it may
-- list expired sessions: prune it, then try again).
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return 1
