-- reserve(resource, domain, copies, min_copies)
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp,
--       5 this operation's record
-- ARGV: 1 test clock, 2 record ttl, 3 domain, 4 copies, 5 min_copies,
--       6 enforce (1/0), 7 domain limit (-1 = unbounded),
--       8 global limit ('' = none), then (group name, group limit) for
--       each group of the domain
-- Reply: {'ok', granted, domain holds, global holds, holds of each group},
--        {'over', field, count, granted}: the grant would take that count
--        past MAX_COUNT (charon_core::copy::check_bound; nothing changed),
--        {'fenced'} or {'cancelled'}
local now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
if cancelled(KEYS[5]) then return { 'cancelled' } end
expire_staged(KEYS[1], KEYS[3], KEYS[4], now)

local copies = tonumber(ARGV[4])
local min_copies = tonumber(ARGV[5])
local groups, limits = {}, { limit_arg(ARGV[7]), optional_limit_arg(ARGV[8]) }
for i = 9, #ARGV, 2 do
  groups[#groups + 1] = ARGV[i]
  limits[#limits + 1] = limit_arg(ARGV[i + 1])
end
local fs = fields(ARGV[3], groups)
local held = values(KEYS[1], fs)

local granted
if ARGV[6] == '1' then
  local room = INF
  for i = 1, #fs do room = math.min(room, math.max(limits[i] - held[i], 0)) end
  granted = math.min(copies, room)
  if granted < min_copies then granted = 0 end
else
  granted = copies
end

if granted > 0 then
  -- charon_core::copy::check_bound: domain, resource, then each group.
  for i = 1, #fs do
    if not within_bound(held[i], granted) then
      return { 'over', fs[i], fmt(held[i]), fmt(granted) }
    end
  end
  add(KEYS[1], fs, granted)
  add(KEYS[2], fs, granted)
  for i = 1, #fs do held[i] = held[i] + granted end
  remember(KEYS[5], ARGV[2], { 'reserve', granted, ARGV[3], groups })
end
local reply = { 'ok', granted }
for i = 1, #fs do reply[#reply + 1] = held[i] end
return reply
