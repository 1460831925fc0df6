-- Renews this member's liveness.
-- KEYS: 1 this member's liveness, 2 generation, 3 registry
-- ARGV: 1 the generation this member joined, 2 ttl (ms), 3 member id,
--       4 a new generation id (used if Redis has none)
-- Reply: {outcome, generation}; outcome is
--   'ok'     renewed
--   'lapsed' the liveness key is gone although Redis kept its data: other
--            servers may have removed this server's contributions; it
--            must resign
--   'new'    Redis lost its data (restart without persistence, flush):
--            nothing of the old copy log is left to protect; this member
--            registers again in the new generation
local gen = redis.call('GET', KEYS[2])
if gen == ARGV[1] then
  if redis.call('SET', KEYS[1], ARGV[2], 'XX', 'PX', ARGV[2]) then
    return { 'ok', gen }
  end
  return { 'lapsed', gen }
end
if not gen then
  gen = ARGV[4]
  redis.call('SET', KEYS[2], gen)
end
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[2])
return { 'new', gen }
