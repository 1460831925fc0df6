-- request(resource, domain, copies, min_copies): a line-by-line port of
-- charon_core::rate::decide (SPEC §2 rules 1-6) and RateState::forget_at.
-- The differential test (tests/differential.rs) holds the two together.
--
-- KEYS[1]  the pair's state: entry times and hit totals
-- KEYS[2]  the pair's hits in the last second (list)
-- KEYS[3]  the resource's hits in the last second, across domains (list)
-- KEYS[4]  the total of KEYS[3]
-- KEYS[4 + i]  the hits of tier i (list), for each configured tier
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2] expiry slack (ms)
-- ARGV[3]  DORMANT_GRACE                     ARGV[4] copies
-- ARGV[5]  min_copies                        ARGV[6] 1 = enforce, 0 = ignore
-- ARGV[7]  H ('' = none)                     ARGV[8] G ('' = none)
-- ARGV[9]  number of tiers n
-- ARGV[10], ARGV[11]  head and tail of a tier list's key (head .. i .. tail),
--          to drop the lists of tiers the configuration no longer has
-- ARGV[12..]  five per tier: limit (-1 = unbounded), window,
--          active (-1 = infinite), cooldown, skippable (1/0)
--
-- Reply: {granted, domain_hits_last_second, global_hits_last_second,
--         tier_hits, tier, burst, hard_limited, global_limited}
--
-- Layout (see docs/redis.md). A log of hits is a Redis list of 16-byte
-- entries (f64 time, f64 hits), oldest first, one per millisecond with
-- hits; its total is kept beside it. Only the ends of a list are ever
-- read, so a request costs the same however many hits the windows hold
-- (Lua strings are expensive to make in Redis: nothing big is copied in).
--   state := u8 version=2 | f64 forget_at (-1 = never)
--            | f64 last-second total | u32 tiers
--            | tiers * (f64 entered (-1 = never) | f64 total)
-- A list that is missing holds nothing, whatever its total says (it can
-- only have expired once all its hits were out of their window).

local SECOND = 1000
local ACTIVE, COOLDOWN, INACTIVE = 1, 2, 3

-- HitLog on a list ----------------------------------------------------------

local function log_new(key, total)
  return { key = key, n = total or 0, tail = nil, tail_n = 0, loaded = false, changed = false }
end

-- The latest entry (time, hits), read once.
local function log_load(l)
  if l.loaded then return end
  l.loaded = true
  -- A total of zero is an empty list: lists are deleted when emptied.
  if l.n == 0 then return end
  local v = redis.call('LINDEX', l.key, -1)
  if v then
    l.tail, l.tail_n = struct.unpack('<dd', v)
  else
    l.tail = nil
    if l.n ~= 0 then
      l.n = 0
      l.changed = true
    end
  end
end

local function log_latest(l)
  log_load(l)
  return l.tail
end

local function log_clear(l)
  log_load(l)
  if l.tail then redis.call('DEL', l.key) end
  if l.tail or l.n ~= 0 then l.changed = true end
  l.n, l.tail, l.tail_n = 0, nil, 0
end

-- Forgets hits that fell out of a window of `span` ending at `now` (closed
-- on the left: a hit at t stays while now - t <= span).
local function log_prune(l, now, span)
  log_load(l)
  if not l.tail then return end
  if now - l.tail > span then
    log_clear(l)
    return
  end
  while true do
    local t, c = struct.unpack('<dd', redis.call('LINDEX', l.key, 0))
    if now - t <= span then return end
    redis.call('LPOP', l.key)
    l.n = l.n - c
    l.changed = true
  end
end

-- Records `c` hits at `t` (never earlier than the latest entry); hits of
-- one millisecond share an entry.
local function log_record(l, t, c)
  if c == 0 then return end
  log_load(l)
  if l.tail == t then
    l.tail_n = l.tail_n + c
    redis.call('LSET', l.key, -1, struct.pack('<dd', t, l.tail_n))
  else
    l.tail, l.tail_n = t, c
    redis.call('RPUSH', l.key, struct.pack('<dd', t, c))
  end
  l.n = l.n + c
  l.changed = true
end

-- RateState -------------------------------------------------------------

local tier_key_head, tier_key_tail = ARGV[10], ARGV[11]

local function tier_key(i)
  return KEYS[4 + i] or (tier_key_head .. i .. tier_key_tail)
end

-- (state, stored forget_at, stored tier count); forget_at is nil when
-- there was no state.
local function state_decode(raw)
  local st = { last = nil, tiers = {} }
  if not raw then
    st.last = log_new(KEYS[2], 0)
    return st, nil, 0
  end
  local version, forget, last, count, p = struct.unpack('<BddI4', raw, 1)
  if version ~= 2 then
    error({ err = 'CHARON bad data: rate state version ' .. version })
  end
  st.last = log_new(KEYS[2], last)
  for i = 1, count do
    local e, n
    e, n, p = struct.unpack('<dd', raw, p)
    local ts = { entered = nil, hits = log_new(tier_key(i), n) }
    if e >= 0 then ts.entered = e end
    st.tiers[i] = ts
  end
  return st, forget, count
end

local function state_encode(st, forget)
  local parts = { struct.pack('<BddI4', 2, forget, st.last.n, #st.tiers) }
  for _, ts in ipairs(st.tiers) do
    parts[#parts + 1] = struct.pack('<dd', ts.entered or -1, ts.hits.n)
  end
  return table.concat(parts)
end

-- RateState::latest
local function state_latest(st)
  local m = log_latest(st.last) or 0
  for _, ts in ipairs(st.tiers) do
    if ts.entered and ts.entered > m then m = ts.entered end
    local h = log_latest(ts.hits)
    if h and h > m then m = h end
  end
  return m
end

-- Phase::of, with differences instead of sums so that nothing is rounded.
local function phase_of(tier, entered, now)
  if entered == nil then return INACTIVE end
  if tier.active == nil then return ACTIVE end
  local d = now - entered
  if d < tier.active then return ACTIVE end
  if d - tier.active < tier.cooldown then return COOLDOWN end
  return INACTIVE
end

local function phase(st, tiers, i, now)
  local ts = st.tiers[i]
  return phase_of(tiers[i], ts and ts.entered, now)
end

-- RateState::advance; returns whether the tier list shrank.
local function advance(st, tiers, now)
  local shrank = false
  for i = #st.tiers, #tiers + 1, -1 do
    log_clear(st.tiers[i].hits)
    st.tiers[i] = nil
    shrank = true
  end
  for i, ts in ipairs(st.tiers) do
    local ph = phase_of(tiers[i], ts.entered, now)
    if ph == INACTIVE then
      ts.entered = nil
      log_clear(ts.hits)
    elseif ph == COOLDOWN then
      log_clear(ts.hits)
    else
      log_prune(ts.hits, now, tiers[i].window)
    end
  end
  while #st.tiers > 0 and st.tiers[#st.tiers].entered == nil do
    st.tiers[#st.tiers] = nil
    shrank = true
  end
  log_prune(st.last, now, SECOND)
  return shrank
end

-- RateState::current_tier
local function current_tier(st, tiers, now)
  for i = math.min(#tiers, #st.tiers), 1, -1 do
    if phase(st, tiers, i, now) == ACTIVE then return i end
  end
  return 0
end

local function tier_hits(st, i)
  if i == 0 then return 0 end
  local ts = st.tiers[i]
  if ts then return ts.hits.n end
  return 0
end

-- RateState::forget_at; -1 is never.
local function forget_at(st, tiers, grace)
  local at = 0
  local l = log_latest(st.last)
  if l then at = l + SECOND + 1 end
  for i, ts in ipairs(st.tiers) do
    if i > #tiers then break end
    if ts.entered then
      local tier = tiers[i]
      local until_
      if tier.active then
        until_ = ts.entered + tier.active + tier.cooldown
      elseif i == 1 then
        until_ = state_latest(st) + tier.window + 1 + grace
      else
        return -1
      end
      if until_ > at then at = until_ end
    end
  end
  return at
end

-- decide ------------------------------------------------------------------

local function burst_target(st, tiers, from, now)
  for j = from + 1, #tiers do
    local tier = tiers[j]
    local blocked = tier.limit == 0 or phase(st, tiers, j, now) == COOLDOWN
    if not blocked then return j end
    if not tier.skippable then return nil end
  end
  return nil
end

-- The way `want` hits would go through the tiers, and how many would pass.
local function plan(st, tiers, current, now, want)
  local steps = {}
  local total = 0
  local at = current
  if at >= 1 then
    local room = math.max(tiers[at].limit - tier_hits(st, at), 0)
    local take = math.min(room, want)
    if take > 0 then
      steps[#steps + 1] = { tier = at, take = take, enter = false }
      total = total + take
    end
  end
  while total < want do
    local j = burst_target(st, tiers, at, now)
    if not j then break end
    local take = math.min(tiers[j].limit, want - total)
    steps[#steps + 1] = { tier = j, take = take, enter = true }
    total = total + take
    at = j
  end
  return steps, total
end

local function room(limit, used)
  return math.max(limit - used, 0)
end

local now_raw, redis_now = clock(ARGV[1])
local slack = tonumber(ARGV[2])
local grace = tonumber(ARGV[3])
local copies = tonumber(ARGV[4])
local min_copies = tonumber(ARGV[5])
local enforce = ARGV[6] == '1'
local hard = optional_limit_arg(ARGV[7])
local global_limit = optional_limit_arg(ARGV[8])
local tiers = {}
for i = 1, tonumber(ARGV[9]) do
  local b = 11 + (i - 1) * 5
  local active = tonumber(ARGV[b + 3])
  if active < 0 then active = nil end
  tiers[i] = {
    limit = limit_arg(ARGV[b + 1]),
    window = tonumber(ARGV[b + 2]),
    active = active,
    cooldown = tonumber(ARGV[b + 4]),
    skippable = ARGV[b + 5] == '1',
  }
end

local raw = redis.call('GET', KEYS[1])
local st, stored_forget, stored_count = state_decode(raw)
if not raw or (stored_forget >= 0 and now_raw >= stored_forget) then
  -- No state, or it may be forgotten: start from nothing (and drop lists
  -- a forgotten state may have left).
  redis.call('DEL', KEYS[2])
  for i = 1, math.max(#tiers, stored_count) do redis.call('DEL', tier_key(i)) end
  st = { last = log_new(KEYS[2], 0), tiers = {} }
end
local glog = log_new(KEYS[3], tonumber(redis.call('GET', KEYS[4])) or 0)

-- A clock that stepped back must not put recorded hits in the future.
local now = math.max(now_raw, state_latest(st), log_latest(glog) or 0)
local shrank = advance(st, tiers, now)
log_prune(glog, now, SECOND)
local current = current_tier(st, tiers, now)

local steps, through_tiers = plan(st, tiers, current, now, copies)
local wish = math.min(copies, through_tiers)
local hard_room = room(hard, st.last.n)
local global_room = room(global_limit, glog.n)
local hard_limited = hard_room < wish and hard_room <= global_room
local global_limited = global_room < wish and global_room <= hard_room

local granted, recorded = 0, 0
if enforce then
  local n = math.min(copies, wish, hard_room, global_room)
  if n >= min_copies then granted, recorded = n, n end
else
  granted, recorded = copies, wish
end

local tier = current
local burst = false
local entered_changed = false
if granted > 0 then
  local left = recorded
  for _, step in ipairs(steps) do
    if left == 0 then break end
    local take = math.min(step.take, left)
    for i = #st.tiers + 1, step.tier do
      st.tiers[i] = { entered = nil, hits = log_new(tier_key(i), 0) }
    end
    local ts = st.tiers[step.tier]
    if step.enter then
      ts.entered = now
      log_clear(ts.hits)
      burst = true
      entered_changed = true
    end
    log_record(ts.hits, now, take)
    left = left - take
    tier = step.tier
  end
  log_record(st.last, now, granted)
  log_record(glog, now, granted)
end

-- Store what changed. A rejection records nothing; the hits that time
-- alone made irrelevant are dropped either way (as in the in-memory store),
-- and then the state is written back with the time from which it may be
-- forgotten, so that Redis forgets it exactly when the in-memory store
-- would.
local forget = forget_at(st, tiers, grace)
local changed = entered_changed or shrank or st.last.changed or forget ~= stored_forget
for _, ts in ipairs(st.tiers) do
  changed = changed or ts.hits.changed
end
if raw and changed or granted > 0 then
  if forget >= 0 and forget <= now_raw then
    redis.call('DEL', KEYS[1], KEYS[2])
    for i = 1, #st.tiers do redis.call('DEL', tier_key(i)) end
  else
    redis.call('SET', KEYS[1], state_encode(st, forget))
    expire_at(KEYS[1], forget, now_raw, redis_now, slack)
    expire_at(KEYS[2], forget, now_raw, redis_now, slack)
    for i = 1, #st.tiers do expire_at(tier_key(i), forget, now_raw, redis_now, slack) end
  end
end
if glog.changed then
  if glog.tail then
    redis.call('SET', KEYS[4], fmt(glog.n))
    expire_at(KEYS[3], glog.tail + SECOND + 1, now_raw, redis_now, slack)
    expire_at(KEYS[4], glog.tail + SECOND + 1, now_raw, redis_now, slack)
  else
    redis.call('DEL', KEYS[4])
  end
end

local function flag(b)
  if b then return 1 end
  return 0
end

return {
  granted,
  st.last.n,
  glog.n,
  tier_hits(st, tier),
  tier,
  flag(burst),
  flag(hard_limited),
  flag(global_limited),
}
