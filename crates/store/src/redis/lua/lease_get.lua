-- lease_get(): one resource's lease set, and the decision clock, for a
-- lease decision made by the server (charon_core::lease) and stored back
-- with lease_put only if nobody changed the set in between.
-- The set is a hash: `e` (an id drawn when it was created), `v` (a counter
-- of writes) and `c:<client>` per lease; its version is "e:v", or "0" when
-- there is none, so a set deleted and made again never repeats a version.
-- With a token, the caller takes the resource's decision lock first (held
-- until its lease_put, or for ARGV[4] ms at most): servers then take turns
-- on a resource instead of racing, so a slow one (a whole set to read) is
-- not starved by a fast one. The version check of lease_put stays the
-- safety; the lock only orders.
-- KEYS: 1 the resource's lease set, 2 its decision lock
-- ARGV: 1 clock ('' = Redis TIME), 2 the version the caller has cached
--       (''), 3 the caller's lock token ('' = read without the lock),
--       4 the lock's time limit in ms
-- Reply: { 'busy' } when another server holds the lock; { version, now, 0 }
--        when the cached version is current; else
--        { version, now, 1, { field, value, … } }
if ARGV[3] ~= '' then
  local held = redis.call('GET', KEYS[2])
  if held and held ~= ARGV[3] then return { 'busy' } end
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
end
local now = clock(ARGV[1])
local ev = redis.call('HMGET', KEYS[1], 'e', 'v')
local version = '0'
if ev[1] then version = ev[1] .. ':' .. ev[2] end
if ARGV[2] == version then return { version, now, 0 } end
return { version, now, 1, redis.call('HGETALL', KEYS[1]) }
