-- transfer(resource, domain, copies, groups, ttl): the copies leave this
-- server's contribution and wait in the staging area, still counted and
-- owned by no server, until seized or expired.
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp,
--       5 this operation's record
-- ARGV: 1 test clock, 2 record ttl, 3 domain, 4 copies, 5 ttl,
--       6 transfer id, then the hold's groups
-- Reply: {'ok'}, {'short', field, contributed}, {'fenced'} or {'cancelled'}
local now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
if cancelled(KEYS[5]) then return { 'cancelled' } end
wait_keys(KEYS[1])
pass_time(now, KEYS[3], KEYS[4])

local n = tonumber(ARGV[4])
local groups, fs, short = covered(KEYS[2], ARGV[3], n, 7)
if short then return short end
sub(KEYS[2], fs, n)
local expires = now + tonumber(ARGV[5])
redis.call('HSET', KEYS[3], ARGV[6], cmsgpack.pack({ expires, n, ARGV[3], groups }))
redis.call('ZADD', KEYS[4], fmt(expires), ARGV[6])
remember(KEYS[5], ARGV[2], { 'transfer', n, ARGV[3], groups, ARGV[6] })
return { 'ok' }
