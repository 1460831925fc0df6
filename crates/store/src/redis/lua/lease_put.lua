-- lease_put(): stores one lease decision made on the version lease_get
-- read, unless another server stored one since (compare and set: every
-- lease decision is atomic across servers, none is lost), and gives the
-- decision lock back. A decision changes one client's lease and drops
-- lapsed ones, so only those fields are written.
-- Each write appends the clients it changed to the change log (see
-- lease_get), which keeps the last 1024 writes.
-- KEYS: 1 the resource's lease set, 2 its decision lock, 3 its change log
-- ARGV: 1 the version read, 2 a fresh id for a new set, 3 clock ('' = Redis
--       TIME), 4 when the last lease lapses (decision clock, ms; -1: the set
--       is empty, delete it), 5 expiry slack, 6 the lock token, 7 n (leases
--       to write), then n pairs (client, lease), then clients whose leases
--       go
-- Reply: { 1, new version, 1 if the set was created } stored, { 0 } changed
-- in between (decide again)
if redis.call('GET', KEYS[2]) == ARGV[6] then redis.call('DEL', KEYS[2]) end
local ev = redis.call('HMGET', KEYS[1], 'e', 'v')
local version = '0'
if ev[1] then version = ev[1] .. ':' .. ev[2] end
if version ~= ARGV[1] then return { 0 } end
if ARGV[4] == '-1' then
  redis.call('DEL', KEYS[1], KEYS[3])
  return { 1, '0', 0 }
end
local e, v = ev[1], tonumber(ev[2] or '0')
if not e then
  e = ARGV[2]
  redis.call('HSET', KEYS[1], 'e', e)
end
local n = tonumber(ARGV[7])
local i = 8
local changed = {}
for _ = 1, n do
  redis.call('HSET', KEYS[1], 'c:' .. ARGV[i], ARGV[i + 1])
  changed[#changed + 1] = ARGV[i]
  i = i + 2
end
while i <= #ARGV do
  redis.call('HDEL', KEYS[1], 'c:' .. ARGV[i])
  changed[#changed + 1] = ARGV[i]
  i = i + 1
end
redis.call('HSET', KEYS[1], 'v', v + 1)
-- A new set starts a new log: entries of an earlier set (same key, other
-- `e`) must not be read as this one's.
if not ev[1] then redis.call('DEL', KEYS[3]) end
redis.call('RPUSH', KEYS[3], table.concat(changed, '\31'))
redis.call('LTRIM', KEYS[3], -1024, -1)
local now, redis_now = clock(ARGV[3])
expire_at(KEYS[1], tonumber(ARGV[4]), now, redis_now, tonumber(ARGV[5]))
expire_at(KEYS[3], tonumber(ARGV[4]), now, redis_now, tonumber(ARGV[5]))
local created = 0
if not ev[1] then created = 1 end
return { 1, e .. ':' .. (v + 1), created }
