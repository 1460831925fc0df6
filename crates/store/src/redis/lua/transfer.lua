-- transfer(resource, domain, copies, groups, ttl): the copies leave this
-- server's contribution and wait in the staging area, still counted and
-- owned by no server, until seized or expired.
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp
-- ARGV: 1 test clock, 2 domain, 3 copies, 4 ttl, 5 transfer id,
--       then the hold's groups
-- Reply: {'ok'}, {'short', field, contributed} or {'fenced'}
local now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
expire_staged(KEYS[1], KEYS[3], KEYS[4], now)

local n = tonumber(ARGV[3])
local groups = {}
for i = 6, #ARGV do groups[#groups + 1] = ARGV[i] end
local fs = fields(ARGV[2], groups)
local mine = values(KEYS[2], fs)
for i = 1, #fs do
  if mine[i] < n then return { 'short', fs[i], mine[i] } end
end
sub(KEYS[2], fs, n)
local expires = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[3], ARGV[5], cmsgpack.pack({ expires, n, ARGV[2], groups }))
redis.call('ZADD', KEYS[4], fmt(expires), ARGV[5])
return { 'ok' }
