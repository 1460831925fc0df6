-- lease_get(): one resource's lease set, and the decision clock, for a
-- lease decision made by the server (charon_core::lease) and stored back
-- with lease_put only if nobody changed the set in between.
-- The set is a hash: `e` (an id drawn when it was created), `v` (a counter
-- of writes) and `c:<client>` per lease; its version is "e:v", or "0" when
-- there is none, so a set deleted and made again never repeats a version.
-- KEYS: 1 the resource's lease set
-- ARGV: 1 clock ('' = Redis TIME), 2 the version the caller has cached ('')
-- Reply: { version, now, 0 } when the cached version is current, else
--        { version, now, 1, { field, value, … } }
local now = clock(ARGV[1])
local ev = redis.call('HMGET', KEYS[1], 'e', 'v')
local version = '0'
if ev[1] then version = ev[1] .. ':' .. ev[2] end
if ARGV[2] == version then return { version, now, 0 } end
return { version, now, 1, redis.call('HGETALL', KEYS[1]) }
