-- lease_put(): stores one lease decision made on the version of the set
-- the caller had (read by lease_get, or its own last write), unless
-- another server stored one since (compare and set: every lease decision
-- is atomic across servers, none is lost) or holds the set's decision lock
-- (see lease_get), and gives back the caller's lock. A decision changes
-- one client's lease and drops lapsed ones, so only those fields are
-- written, with the version and the ring entry, in one HSET; the key's
-- expiry is pushed only when a lease would outlive it, and then to twice
-- as far from now, so a refresh usually costs HMGET and HSET alone.
-- Flat code, no shared prelude: this is the refresh's hot path.
-- KEYS: 1 the resource's lease set
-- ARGV: 1 the version decided on, 2 a fresh id for a new set, 3 the
--       decision's time (decision clock, ms), 4 when its last lease lapses
--       (-1: the set is empty, delete it), 5 when the key is to expire
--       (decision clock), 6 expiry slack, 7 the lock token, 8 n (leases to
--       write), then n pairs (client, lease), then clients whose leases go
-- Reply: { 1, new version, 1 if the set was created } stored;
--        { 0 } changed in between (read again and decide again);
--        { 2 } another server's turn (its lock is held): try again soon
local h = redis.call('HMGET', KEYS[1], 'e', 'v', 'lk', 'x')
local e = h[1]
local version = '0'
if e then version = e .. ':' .. h[2] end
if version ~= ARGV[1] then return { 0 } end
local lk = h[3]
local held = lk and lk ~= ''
if held then
  local token, deadline = string.match(lk, '^(.*)\31(%d+)$')
  if token ~= ARGV[7] then
    local t = redis.call('TIME')
    local redis_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if tonumber(deadline) > redis_now then return { 2 } end
  end
end
if ARGV[4] == '-1' then
  redis.call('DEL', KEYS[1])
  return { 1, '0', 0 }
end
local created = 0
local v = 1
if e then
  v = tonumber(h[2]) + 1
else
  e = ARGV[2]
  created = 1
end
local set = { 'v', v }
if created == 1 then
  set[#set + 1] = 'e'
  set[#set + 1] = e
end
local changed = { v }
local n = tonumber(ARGV[8])
local i = 9
for _ = 1, n do
  set[#set + 1] = 'c:' .. ARGV[i]
  set[#set + 1] = ARGV[i + 1]
  changed[#changed + 1] = ARGV[i]
  i = i + 2
end
local gone = {}
while i <= #ARGV do
  gone[#gone + 1] = 'c:' .. ARGV[i]
  changed[#changed + 1] = ARGV[i]
  i = i + 1
end
set[#set + 1] = 'g:' .. (v % 256)
set[#set + 1] = table.concat(changed, '\31')
if held then
  set[#set + 1] = 'lk'
  set[#set + 1] = ''
end
local last, x = tonumber(ARGV[4]), tonumber(h[4] or '-1')
local expire = created == 1 or last > x
if expire then
  set[#set + 1] = 'x'
  set[#set + 1] = ARGV[5]
end
redis.call('HSET', KEYS[1], unpack(set))
-- In chunks: unpack() has a limit, and many leases may lapse at once.
for j = 1, #gone, 1000 do
  redis.call('HDEL', KEYS[1], unpack(gone, j, math.min(j + 999, #gone)))
end
if expire then
  local at = tonumber(ARGV[5])
  if at >= 4503599627370496 then
    redis.call('PERSIST', KEYS[1])
  else
    local ttl = at - tonumber(ARGV[3]) + tonumber(ARGV[6])
    if ttl < 1 then ttl = 1 end
    redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
  end
end
return { 1, e .. ':' .. v, created }
