-- release(resource, domain, copies, groups)
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp,
--       5 this operation's record
-- ARGV: 1 test clock, 2 record ttl, 3 domain, 4 copies, then the hold's groups
-- Reply: {'ok', domain holds, global holds, holds of each group}
--        {'short', field, contributed}: this server does not hold them
--        {'bad', field, count}: a count below this server's contribution
--        {'fenced'} or {'cancelled'}
local now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
if cancelled(KEYS[5]) then return { 'cancelled' } end
expire_staged(KEYS[1], KEYS[3], KEYS[4], now)

local n = tonumber(ARGV[4])
local groups, fs, short = covered(KEYS[2], ARGV[3], n, 5)
if short then return short end
local counts = values(KEYS[1], fs)
for i = 1, #fs do
  if counts[i] < n then return { 'bad', fs[i], counts[i] } end
end
sub(KEYS[1], fs, n)
sub(KEYS[2], fs, n)
remember(KEYS[5], ARGV[2], { 'release', n, ARGV[3], groups })
local reply = { 'ok' }
for i = 1, #fs do reply[#reply + 1] = counts[i] - n end
return reply
