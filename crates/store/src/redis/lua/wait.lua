-- Waiting for a copy (shared by the copy scripts, after copy.lua): the
-- resource's queue of waiters, served in the same script as every change
-- of its counts. A port of charon_core::copy::wait (arrive is reserve.lua;
-- serve, expire_waiters, result_ready and leave are here): the
-- differential test with waits keeps the two equal.
--
-- The queue's keys sit beside the counts (named from the counts key, so
-- in the resource's slot):
--   <base>:q   zset    waiting tickets, each scored by itself: tickets grow,
--                      so the order is the order of arrival at Redis
--   <base>:qw  hash    ticket -> msgpack waiter (see `waiter` below)
--   <base>:qd  zset    waiting tickets by deadline
--   <base>:qr  hash    ticket -> msgpack answer not taken yet (see `answer`)
--   <base>:qn  string  the last ticket given out
-- A waiter: { member, domain, copies, min_copies, domain limit arg, global
-- limit arg, {group names}, {group limit args}, arrived, deadline }; the
-- limits as they travel (-1 unbounded, '' no global limit).
-- An answer: { granted, domain limit arg, global limit arg, domain holds,
-- global holds, {group names}, {group limit args}, {group holds},
-- queue_full, result_ready, waited ms (-1: none), member, domain }.
-- Every decided waiter's member hears of it on its wake-up channel
-- (<prefix>:wake:<member>, message '<tag> <ticket>'); the answer waits in
-- <base>:qr until that member takes it (or the keys expire).

-- The queue of the resource whose counts key this script runs on.
local W = nil
-- A ticket decided by the script that runs (its arrival): answered in the
-- reply, so nobody needs to be woken for it.
local ARRIVAL = nil
-- How long answers not taken yet stay (ms): past any poll of a live
-- waiter; a gone waiter's copies are its dead server's contribution.
local ANSWER_TTL = 600000

local function wait_keys(counts)
  local base = string.sub(counts, 1, -3)
  W = {
    base = base,
    counts = counts,
    q = base .. ':q',
    w = base .. ':qw',
    d = base .. ':qd',
    r = base .. ':qr',
    n = base .. ':qn',
    tag = string.match(counts, '{(.-)}'),
    prefix = string.match(counts, '^(.-):{'),
  }
end

-- The member a contribution key belongs to.
local function member_of(contribution)
  return string.sub(contribution, #W.base + 4)
end

local function waiting()
  return redis.call('EXISTS', W.q) == 1
end

-- A waiter's count fields and its limits in the same order (domain,
-- resource, groups).
local function waiter_limits(w)
  local lim = { limit_arg(w[5]), optional_limit_arg(w[6]) }
  for _, l in ipairs(w[8]) do lim[#lim + 1] = limit_arg(l) end
  return fields(w[2], w[7]), lim
end

local function drop_waiter(id)
  redis.call('ZREM', W.q, id)
  redis.call('HDEL', W.w, id)
  redis.call('ZREM', W.d, id)
end

-- Leaves waiter `w`'s answer (`granted` copies, counts `held` as of after
-- the decision) for its member and wakes it.
local function decide(id, w, granted, held, now, result_ready)
  local gh = {}
  for k = 3, #held do gh[#gh + 1] = held[k] end
  local answer = {
    granted, w[5], w[6], held[1], held[2], w[7], w[8], gh,
    0, result_ready and 1 or 0, math.max(now - w[9], 0), w[1], w[2],
  }
  redis.call('HSET', W.r, id, cmsgpack.pack(answer))
  -- Once a script: answering 10,000 waiters at their deadline is one run.
  if not W.answers_expire then
    redis.call('PEXPIRE', W.r, ANSWER_TTL)
    W.answers_expire = true
  end
  if id ~= ARRIVAL then
    redis.call('PUBLISH', W.prefix .. ':wake:' .. w[1], W.tag .. ' ' .. id)
  end
end

-- The usual rejection of waiter `w`: nothing granted, the counts as they are.
local function reject(id, w, now, result_ready)
  local fs = waiter_limits(w)
  decide(id, w, 0, values(W.counts, fs), now, result_ready)
end

-- charon_core::copy::wait::walk: serves the queue at `now`. Every waiter in
-- arrival order that its limits let take at least min_copies takes the
-- most they allow (within MAX_COUNT) and leaves; one blocked by its own
-- domain or group limit is passed over; one blocked only by the global
-- limit stops the serving. Returns the ticket it stopped at, or nil.
local function walk(now)
  local rank = 0
  while true do
    local ids = redis.call('ZRANGE', W.q, rank, rank + 63)
    if #ids == 0 then return nil end
    local raws = redis.call('HMGET', W.w, unpack(ids))
    local removed = 0
    for i, id in ipairs(ids) do
      local w = cmsgpack.unpack(raws[i])
      local fs, lim = waiter_limits(w)
      local held = values(W.counts, fs)
      local room = INF
      for k = 1, #fs do room = math.min(room, math.max(lim[k] - held[k], 0)) end
      local n = math.min(w[3], room)
      local grant = n >= w[4]
      if grant then
        for k = 1, #fs do
          if not within_bound(held[k], n) then grant = false end
        end
      end
      if grant then
        drop_waiter(id)
        removed = removed + 1
        add(W.counts, fs, n)
        add(W.base .. ':s:' .. w[1], fs, n)
        for k = 1, #fs do held[k] = held[k] + n end
        decide(id, w, n, held, now, false)
      else
        local own = math.max(lim[1] - held[1], 0)
        for k = 3, #fs do own = math.min(own, math.max(lim[k] - held[k], 0)) end
        local global = math.max(lim[2] - held[2], 0)
        if own >= w[4] and global < w[4] then return id end
      end
    end
    rank = rank + #ids - removed
  end
end

-- charon_core::copy::expire_waiters: rejects, in order of deadline (then
-- of arrival), every waiter whose deadline is at or before `now`, serving
-- again when the one leaving is the one the serving stopped at.
local function expire_waiters(now)
  local raw = redis.call('ZRANGEBYSCORE', W.d, '-inf', fmt(now), 'WITHSCORES')
  if #raw == 0 then return end
  local due = {}
  for i = 1, #raw, 2 do
    due[#due + 1] = { tonumber(raw[i + 1]), tonumber(raw[i]), raw[i] }
  end
  table.sort(due, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  local stop = walk(now)
  for _, d in ipairs(due) do
    local id = d[3]
    local w = redis.call('HGET', W.w, id)
    if w then
      drop_waiter(id)
      reject(id, cmsgpack.unpack(w), now, false)
      if id == stop then stop = walk(now) end
    end
  end
end

-- What time alone did before an operation (the in-memory store's
-- pass_time): waiters past their deadline rejected, expired transfers
-- released, and the queue served after them.
local function pass_time(now, staging, staging_exp)
  local queued = waiting()
  if queued then expire_waiters(now) end
  local expired = expire_staged(W.counts, staging, staging_exp, now)
  if expired > 0 and queued then walk(now) end
end

-- charon_core::copy::result_ready: every waiter of `domain` answered with
-- no copy and result_ready, in queue order.
local function result_ready(domain, now)
  local ids = redis.call('ZRANGE', W.q, 0, -1)
  for _, id in ipairs(ids) do
    local w = cmsgpack.unpack(redis.call('HGET', W.w, id))
    if w[2] == domain then
      drop_waiter(id)
      reject(id, w, now, true)
    end
  end
end

-- Takes ticket `id`'s answer, if it has one.
local function take(id)
  local raw = redis.call('HGET', W.r, id)
  if not raw then return nil end
  redis.call('HDEL', W.r, id)
  return cmsgpack.unpack(raw)
end

-- Takes every waiter and answer of `member` out (its server is dead or
-- gone), then serves the queue. Returns how many waiters left.
local function drop_member(member, now)
  local gone = 0
  local kv = redis.call('HGETALL', W.w)
  for i = 1, #kv, 2 do
    if cmsgpack.unpack(kv[i + 1])[1] == member then
      drop_waiter(kv[i])
      gone = gone + 1
    end
  end
  kv = redis.call('HGETALL', W.r)
  for i = 1, #kv, 2 do
    if cmsgpack.unpack(kv[i + 1])[12] == member then redis.call('HDEL', W.r, kv[i]) end
  end
  if gone > 0 then walk(now) end
  return gone
end

-- An answer as the scripts reply it: 'ok', 'answer', granted, domain limit
-- arg, global limit arg, domain holds, global holds, queue_full,
-- result_ready, waited (-1: none), then (name, limit arg, holds) of each
-- group.
local function answer_reply(a)
  local reply = { 'ok', 'answer', a[1], a[2], a[3], a[4], a[5], a[9], a[10], a[11] }
  for k = 1, #a[6] do
    reply[#reply + 1] = a[6][k]
    reply[#reply + 1] = a[7][k]
    reply[#reply + 1] = a[8][k]
  end
  return reply
end
