-- lease_get(): one resource's lease set as stored, and the decision clock,
-- for a lease decision made by the server (charon_core::lease) and put
-- back with lease_put only if nobody changed the set in between.
-- KEYS: 1 the resource's lease set
-- ARGV: 1 clock ('' = Redis TIME)
-- Reply: { version, body, now } (version 0 and body '' when there is none)
local now = clock(ARGV[1])
local raw = redis.call('GET', KEYS[1])
if not raw then return { 0, '', now } end
local nl = string.find(raw, '\n', 1, true)
if not nl then return redis.error_reply('ERR charon: malformed lease set') end
return { tonumber(string.sub(raw, 1, nl - 1)), string.sub(raw, nl + 1), now }
