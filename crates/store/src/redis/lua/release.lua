-- release(resource, domain, copies, groups), then the queue of waiters is
-- served; with result_ready (wait_mode: shared_result) every waiter of the
-- (resource, domain) is first answered with no copy and result_ready.
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp,
--       5 this operation's record
-- ARGV: 1 test clock, 2 record ttl, 3 domain, 4 copies, 5 result_ready
--       (1/0), then the hold's groups
-- Reply: {'ok', domain holds, global holds, holds of each group}
--        {'short', field, contributed}: this server does not hold them
--        {'bad', field, count}: a count below this server's contribution
--        {'fenced'} or {'cancelled'}
local now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
if cancelled(KEYS[5]) then return { 'cancelled' } end
wait_keys(KEYS[1])
pass_time(now, KEYS[3], KEYS[4])

local n = tonumber(ARGV[4])
local groups, fs, short = covered(KEYS[2], ARGV[3], n, 6)
if short then return short end
local counts = values(KEYS[1], fs)
for i = 1, #fs do
  if counts[i] < n then return { 'bad', fs[i], counts[i] } end
end
sub(KEYS[1], fs, n)
sub(KEYS[2], fs, n)
remember(KEYS[5], ARGV[2], { 'release', n, ARGV[3], groups })
if waiting() then
  if ARGV[5] == '1' then result_ready(ARGV[3], now) end
  walk(now)
end
local reply = { 'ok' }
for i = 1, #fs do reply[#reply + 1] = counts[i] - n end
return reply
