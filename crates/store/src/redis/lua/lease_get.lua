-- lease_get(): one resource's lease set, and the decision clock, for a
-- lease decision made by the server (charon_core::lease) and stored back
-- with lease_put only if nobody changed the set in between.
-- The set is a hash: `e` (an id drawn when it was created), `v` (a counter
-- of writes) and `c:<client>` per lease; its version is "e:v", or "0" when
-- there is none, so a set deleted and made again never repeats a version.
-- The change log (KEYS[3], a list) has one entry per write, the clients it
-- changed, for the last 1024 writes: a caller whose cached version is
-- among them gets only the leases changed since, not the whole set.
-- With a token, the caller takes the resource's decision lock first (held
-- until its lease_put, or for ARGV[4] ms at most): servers then take turns
-- on a resource instead of racing, so a slow one is not starved by a fast
-- one. The version check of lease_put stays the safety; the lock only
-- orders.
-- KEYS: 1 the resource's lease set, 2 its decision lock, 3 its change log
-- ARGV: 1 clock ('' = Redis TIME), 2 the version the caller has cached
--       (''), 3 the caller's lock token ('' = read without the lock),
--       4 the lock's time limit in ms
-- Reply: { 'busy' } when another server holds the lock;
--        { version, now, 0 } when the cached version is current;
--        { version, now, 2, { client, lease or '', … } } the changes since;
--        { version, now, 1, { field, value, … } } the whole set
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
local prefix = (ev[1] or '') .. ':'
if ev[1] and string.sub(ARGV[2], 1, #prefix) == prefix then
  local behind = tonumber(ev[2]) - (tonumber(string.sub(ARGV[2], #prefix + 1)) or -1)
  if behind > 0 and behind <= redis.call('LLEN', KEYS[3]) then
    local seen, names = {}, {}
    for _, entry in ipairs(redis.call('LRANGE', KEYS[3], -behind, -1)) do
      for name in string.gmatch(entry, '[^\31]+') do
        if not seen[name] then
          seen[name] = true
          names[#names + 1] = name
        end
      end
    end
    local out = {}
    for _, name in ipairs(names) do
      out[#out + 1] = name
      out[#out + 1] = redis.call('HGET', KEYS[1], 'c:' .. name) or ''
    end
    return { version, now, 2, out }
  end
end
return { version, now, 1, redis.call('HGETALL', KEYS[1]) }
