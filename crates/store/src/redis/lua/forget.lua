-- Drops a fenced member once its contributions are gone: only if its key
-- set holds no more than the caller cleaned (a resource added meanwhile
-- needs another round).
-- KEYS: 1 dead set, 2 the member's key set
-- ARGV: 1 member id, 2 resources the caller cleaned
-- Reply: 1 forgotten, 0 not now
if redis.call('SCARD', KEYS[2]) > tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[1], ARGV[1])
return 1
