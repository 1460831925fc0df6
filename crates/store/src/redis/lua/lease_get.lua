-- lease_get(): one resource's lease set and the decision clock, for a lease
-- decision made by the server (charon_core::lease) and stored back with
-- lease_put only if nobody changed the set in between. A server runs it
-- only when it has no current copy of the set (none cached, or its last
-- write found the set changed) and for snapshots; otherwise it decides on
-- its copy and lease_put's version check is the read.
-- The set is one hash: `e` (an id drawn when it was created), `v` (a
-- counter of writes), `x` (the decision-clock time its key is set to
-- expire at), `lk` (the decision lock: token US deadline in Redis ms, or
-- ''), `c:<client>` per lease, and a ring of the clients the last 256
-- writes changed, `g:<v mod 256>` = `v US client US …`. Its version is
-- "e:v", or "0" when there is none, so a set deleted and made again never
-- repeats a version. A caller whose cached version is at most 256 writes
-- behind gets only the leases changed since, not the whole set.
-- With a token, the caller takes the set's decision lock (until its
-- lease_put, or ARGV[4] ms at most): a server that lost a race then has
-- its turn instead of racing a fast one again. The version check of
-- lease_put stays the safety; the lock only orders.
-- KEYS: 1 the resource's lease set
-- ARGV: 1 clock ('' = Redis TIME), 2 the version the caller has cached
--       (''), 3 the caller's lock token ('' = read without the lock),
--       4 the lock's time limit in ms
-- Reply: { 'busy' } when another server holds the lock; else { version,
-- now, x (the key's expiry, -1 for none), then
--        0 } when the cached version is current;
--        2, { client, lease or '', … } } the changes since;
--        1, { field, value, … } } the whole hash
local RING = 256
local now, redis_now = clock(ARGV[1])
local h = redis.call('HMGET', KEYS[1], 'e', 'v', 'lk', 'x')
local x = h[4] or '-1'
if ARGV[3] ~= '' and h[1] then
  local lk = h[3]
  if lk and lk ~= '' then
    local token, deadline = string.match(lk, '^(.*)\31(%d+)$')
    if token ~= ARGV[3] and tonumber(deadline) > redis_now then return { 'busy' } end
  end
  redis.call('HSET', KEYS[1], 'lk', ARGV[3] .. '\31' .. fmt(redis_now + tonumber(ARGV[4])))
end
local version = '0'
if h[1] then version = h[1] .. ':' .. h[2] end
if ARGV[2] == version then return { version, now, x, 0 } end
local prefix = (h[1] or '') .. ':'
if h[1] and string.sub(ARGV[2], 1, #prefix) == prefix then
  local v = tonumber(h[2])
  local seen = tonumber(string.sub(ARGV[2], #prefix + 1)) or -1
  local behind = v - seen
  if behind > 0 and behind <= RING then
    local slots = {}
    for w = seen + 1, v do slots[#slots + 1] = 'g:' .. (w % RING) end
    local entries = redis.call('HMGET', KEYS[1], unpack(slots))
    local known, names, fields = {}, {}, {}
    for k, entry in ipairs(entries) do
      local w = seen + k
      -- Each slot must hold write w: a ring overwritten or missing (a
      -- write of an older server kept no ring) means a whole read.
      if not entry then names = nil break end
      local tag, rest = string.match(entry, '^(%d+)\31?(.*)$')
      if tonumber(tag) ~= w then names = nil break end
      for name in string.gmatch(rest, '[^\31]+') do
        if not known[name] then
          known[name] = true
          names[#names + 1] = name
          fields[#fields + 1] = 'c:' .. name
        end
      end
    end
    if names then
      local out = {}
      -- In chunks: unpack() has a limit.
      for j = 1, #fields, 1000 do
        local leases = redis.call('HMGET', KEYS[1], unpack(fields, j, math.min(j + 999, #fields)))
        for k, lease in ipairs(leases) do
          out[#out + 1] = names[j + k - 1]
          out[#out + 1] = lease or ''
        end
      end
      return { version, now, x, 2, out }
    end
  end
end
return { version, now, x, 1, redis.call('HGETALL', KEYS[1]) }
