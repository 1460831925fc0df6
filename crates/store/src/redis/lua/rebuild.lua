-- After Redis lost its data: sets this server's contribution to one
-- resource to exactly what its sessions hold, and moves the counts by the
-- difference. Whatever ran in between (operations of this server that
-- reached the new generation before it noticed, and were reported as
-- failed) is overwritten, so running it twice changes nothing.
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp
-- ARGV: 1 test clock, then for each hold: copies, domain, number of
--       groups, the groups
-- Reply: {'ok', copies this server contributed before, after, fields that
--        would have gone negative} or {'fenced'}
local now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
expire_staged(KEYS[1], KEYS[3], KEYS[4], now)

local want = {}
local i = 2
while i <= #ARGV do
  local n, domain, k = tonumber(ARGV[i]), ARGV[i + 1], tonumber(ARGV[i + 2])
  local groups = {}
  for j = 1, k do groups[j] = ARGV[i + 2 + j] end
  for _, f in ipairs(fields(domain, groups)) do want[f] = (want[f] or 0) + n end
  i = i + 3 + k
end
local had = {}
local kv = redis.call('HGETALL', KEYS[2])
for j = 1, #kv, 2 do had[kv[j]] = tonumber(kv[j + 1]) end

-- Every field either side, in a fixed order.
local names = {}
for f in pairs(want) do names[#names + 1] = f end
for f in pairs(had) do
  if want[f] == nil then names[#names + 1] = f end
end
table.sort(names)
local negative = 0
for _, f in ipairs(names) do
  local d = (want[f] or 0) - (had[f] or 0)
  if d > 0 then
    add(KEYS[1], { f }, d)
  elseif d < 0 then
    negative = negative + sub(KEYS[1], { f }, -d)
  end
end
redis.call('DEL', KEYS[2])
for _, f in ipairs(names) do
  if want[f] then redis.call('HSET', KEYS[2], f, fmt(want[f])) end
end
return { 'ok', had['g'] or 0, want['g'] or 0, negative }
