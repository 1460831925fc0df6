-- The counts of one resource and this server's contribution, for
-- inspection (metrics, tests). Read-only.
-- KEYS: 1 counts, 2 this server's contribution
return { redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]) }
