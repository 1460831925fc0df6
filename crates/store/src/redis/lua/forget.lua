-- Drops a dead member from the membership once its contributions are
-- gone: only if it is still not live and its key set holds no more than
-- the caller cleaned (a resource added meanwhile needs another round).
-- KEYS: 1 registry, 2 the member's liveness, 3 the member's key set
-- ARGV: 1 member id, 2 resources the caller cleaned
-- Reply: 1 forgotten, 0 not now
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SCARD', KEYS[3]) > tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[3])
redis.call('SREM', KEYS[1], ARGV[1])
return 1
