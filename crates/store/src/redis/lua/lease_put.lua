-- lease_put(): stores one lease decision made on the version of the set
-- the caller had (read by lease_get, or its own last write), unless
-- another server stored one since (compare and set: every lease decision
-- is atomic across servers, none is lost) or holds the set's decision lock
-- (see lease_get), and gives back the caller's lock. A decision changes
-- one client's lease and drops lapsed ones, so only those fields are
-- written, with the version and the ring entry, in one HSET.
-- The refresh's hot path: flat code, no shared prelude, and no number
-- conversion (glibc's strtod and printf are most of a small script's
-- cost). The caller knows the set as of the version it decided on, so it
-- sends every value already made: the next version's counter, the ring
-- slot and entry, and the key's new expiry only when a lease would outlive
-- the present one (`x`, also part of that version).
-- KEYS: 1 the resource's lease set
-- ARGV: 1 the version decided on, 2 the next write counter, 3 the lock
--       token, 4 a fresh id (used when the set is new), 5 the key's new
--       expiry for `x` ('' = unchanged; 'delete' = the set is empty,
--       delete it), 6 its time to live in ms ('persist' = none), 7 the ring
--       slot's field, 8 its entry, 9 '1' if the client's lease is written
--       (then 10, 11: its field and the lease) else '0', then the fields of
--       leases that go
-- Reply: { 1, 1 if the set was created } stored;
--        { 0 } changed in between (read again and decide again);
--        { 2 } another server's turn (its lock is held): try again soon
local h = redis.call('HMGET', KEYS[1], 'e', 'v', 'lk')
local e = h[1]
local version = '0'
if e then version = e .. ':' .. h[2] end
if version ~= ARGV[1] then return { 0 } end
local lk = h[3]
local held = lk and lk ~= ''
if held then
  local token, deadline = string.match(lk, '^(.*)\31(%d+)$')
  if token ~= ARGV[3] then
    local t = redis.call('TIME')
    local redis_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if tonumber(deadline) > redis_now then return { 2 } end
  end
end
if ARGV[5] == 'delete' then
  redis.call('DEL', KEYS[1])
  return { 1, 0 }
end
local set = { 'v', ARGV[2], ARGV[7], ARGV[8] }
local created = 0
if not e then
  created = 1
  set[#set + 1] = 'e'
  set[#set + 1] = ARGV[4]
end
local i = 10
if ARGV[9] == '1' then
  set[#set + 1] = ARGV[10]
  set[#set + 1] = ARGV[11]
  i = 12
end
if held then
  set[#set + 1] = 'lk'
  set[#set + 1] = ''
end
if ARGV[5] ~= '' then
  set[#set + 1] = 'x'
  set[#set + 1] = ARGV[5]
end
redis.call('HSET', KEYS[1], unpack(set))
-- In chunks: unpack() has a limit, and many leases may lapse at once.
for j = i, #ARGV, 1000 do
  redis.call('HDEL', KEYS[1], unpack(ARGV, j, math.min(j + 999, #ARGV)))
end
if ARGV[6] == 'persist' then
  redis.call('PERSIST', KEYS[1])
elseif ARGV[5] ~= '' then
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
end
return { 1, created }
