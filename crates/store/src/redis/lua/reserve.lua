-- reserve(resource, domain, copies, min_copies), which may wait for copies
-- (charon_core::copy::arrive).
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp,
--       5 this operation's record
-- ARGV: 1 test clock, 2 record ttl, 3 domain, 4 copies, 5 min_copies,
--       6 enforce (1/0), 7 domain limit (-1 = unbounded),
--       8 global limit ('' = none), 9 wait_ms, 10 queue_limit, 11 expiry
--       slack, then (group name, group limit) for each group of the domain
-- Reply: {'ok', 'now', granted, domain holds, global holds, queue_full,
--        waited (-1: none), holds of each group}: answered at once,
--        {'ok', 'wait', ticket}: waiting in the queue (see wait.lua),
--        {'over', field, count, granted}: the grant would take that count
--        past MAX_COUNT (charon_core::copy::check_bound; nothing changed),
--        {'fenced'} or {'cancelled'}
local now, redis_now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
if cancelled(KEYS[5]) then return { 'cancelled' } end
wait_keys(KEYS[1])
pass_time(now, KEYS[3], KEYS[4])

local copies = tonumber(ARGV[4])
local min_copies = tonumber(ARGV[5])
local wait_ms, queue_limit = tonumber(ARGV[9]), tonumber(ARGV[10])
local waited = -1
if wait_ms > 0 then waited = 0 end
local groups, group_args = {}, {}
local limits = { limit_arg(ARGV[7]), optional_limit_arg(ARGV[8]) }
for i = 12, #ARGV, 2 do
  groups[#groups + 1] = ARGV[i]
  group_args[#group_args + 1] = ARGV[i + 1]
  limits[#limits + 1] = limit_arg(ARGV[i + 1])
end
local fs = fields(ARGV[3], groups)

local function now_reply(granted, held, queue_full)
  local reply = { 'ok', 'now', granted, held[1], held[2], queue_full and 1 or 0, waited }
  for i = 3, #fs do reply[#reply + 1] = held[i] end
  return reply
end

if not waiting() or ARGV[6] ~= '1' then
  -- Nobody waits: the plain reserve (charon_core::copy::reserve).
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
  if granted > 0 or wait_ms == 0 then return now_reply(granted, held, false) end
  if queue_limit == 0 then return now_reply(0, held, true) end
end

-- Joins the queue, which is served; only the arrival can be decided now.
local ticket = tostring(redis.call('INCR', W.n))
ARRIVAL = ticket
local deadline = now + wait_ms
redis.call('HSET', W.w, ticket, cmsgpack.pack({
  member_of(KEYS[2]), ARGV[3], copies, min_copies, ARGV[7], ARGV[8], groups,
  group_args, now, deadline,
}))
redis.call('ZADD', W.q, ticket, ticket)
redis.call('ZADD', W.d, fmt(deadline), ticket)
-- Every script leaves the queue served (nobody before the arrival could
-- take copies, and its arrival changes no count), so the walk can only
-- serve the arrival: it runs only if the arrival's own limits let it take
-- min_copies now (then whether a waiter before it stops the serving is the
-- walk's to say). Walking a long queue on every join would cost each
-- arrival a command per waiter before it.
local held = values(KEYS[1], fs)
local room = INF
for i = 1, #fs do room = math.min(room, math.max(limits[i] - held[i], 0)) end
if math.min(copies, room) >= min_copies then walk(now) end
local mine = take(ticket)
if mine then
  if mine[1] > 0 then
    remember(KEYS[5], ARGV[2], { 'reserve', mine[1], ARGV[3], groups })
  end
  local held = { mine[4], mine[5] }
  for _, h in ipairs(mine[8]) do held[#held + 1] = h end
  return now_reply(mine[1], held, false)
end
if wait_ms > 0 and redis.call('ZCARD', W.q) <= queue_limit then
  -- A waiter whose server never hears of it (a lost reply, a dead server)
  -- falls out at its deadline; the keys outlive the last deadline by the
  -- record ttl, then expire if nobody touches the resource again.
  local slack = tonumber(ARGV[11])
  local keep = deadline + tonumber(ARGV[2])
  for _, k in ipairs({ W.q, W.w, W.d }) do
    if redis.call('PTTL', k) < keep - now then expire_at(k, keep, now, redis_now, slack) end
  end
  expire_at(W.n, keep + 86400000, now, redis_now, slack)
  remember(KEYS[5], ARGV[2], { 'join', 0, ARGV[3], groups, ticket })
  return { 'ok', 'wait', tonumber(ticket) }
end
drop_waiter(ticket)
return now_reply(0, values(KEYS[1], fs), wait_ms > 0)
