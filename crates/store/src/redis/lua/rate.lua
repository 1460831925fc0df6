-- request(resource, domain, copies, min_copies): a line-by-line port of
-- charon_core::rate::decide (SPEC §2 rules 1-6) and RateState::forget_at.
-- The differential test (crates/limiter/tests/differential.rs) holds the two together.
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
--         tier_hits, tier, burst, hard_limited, global_limited}, or
--        {'over', 'd' | 'g', count, granted}: the grant would take the
--        domain's ('d') or all domains' ('g') hits in the last second past
--        MAX_COUNT (charon_core::bound; nothing recorded, as on a rejection)
--
-- Layout (see docs/redis.md). A log of hits is a Redis list of 16-byte
-- entries (f64 time, f64 hits), oldest first, one per millisecond with
-- hits, described by a header kept elsewhere: total, time of the first
-- entry, time and hits of the last. A request reads the headers only and
-- touches a list just to add or drop an entry at its ends, so it costs the
-- same however many hits the windows hold (and makes no big Lua string,
-- which is expensive in Redis).
--   header := f64 total | f64 head | f64 tail | f64 tail hits   (40 bytes)
--   state  := u8 version=3 | f64 forget_at (-1 = never)
--             | f64 lists expire at (-1 = never) | header last second
--             | u32 tiers | tiers * (f64 entered (-1 = never) | header)
--   global total key := f64 lists expire at | header
-- The state key expires at forget_at; the lists at "lists expire at",
-- which is pushed LIST_SLACK past forget_at whenever forget_at overtakes
-- it, so that lists are not re-expired on every request yet never vanish
-- before their header.

local SECOND = 1000
local LIST_SLACK = 60000
local ACTIVE, COOLDOWN, INACTIVE = 1, 2, 3
local ENTRY = '<dd'
local HEADER = '<dddd'

-- HitLog on a list ----------------------------------------------------------

local function log_new(key)
  return { key = key, n = 0, head = -1, tail = -1, tail_n = 0, changed = false, created = false }
end

local function log_decode(key, raw, p)
  local l = log_new(key)
  l.n, l.head, l.tail, l.tail_n, p = struct.unpack(HEADER, raw, p)
  return l, p
end

local function log_encode(l)
  return struct.pack(HEADER, l.n, l.head, l.tail, l.tail_n)
end

local function log_latest(l)
  if l.n == 0 then return nil end
  return l.tail
end

local function log_clear(l)
  if l.n == 0 then return end
  redis.call('DEL', l.key)
  l.n, l.head, l.tail, l.tail_n = 0, -1, -1, 0
  l.changed = true
end

-- Forgets hits that fell out of a window of `span` ending at `now` (closed
-- on the left: a hit at t stays while now - t <= span).
local function log_prune(l, now, span)
  if l.n == 0 then return end
  if now - l.tail > span then
    log_clear(l)
    return
  end
  while now - l.head > span do
    local _, c = struct.unpack(ENTRY, redis.call('LPOP', l.key))
    l.n = l.n - c
    l.head = struct.unpack(ENTRY, redis.call('LINDEX', l.key, 0))
    l.changed = true
  end
end

-- Records `c` hits at `t` (never earlier than the latest entry); hits of
-- one millisecond share an entry.
local function log_record(l, t, c)
  if c == 0 then return end
  if l.n > 0 and l.tail == t then
    l.tail_n = l.tail_n + c
    redis.call('LSET', l.key, -1, struct.pack(ENTRY, t, l.tail_n))
  else
    if l.n == 0 then
      l.head = t
      l.created = true
    end
    l.tail, l.tail_n = t, c
    redis.call('RPUSH', l.key, struct.pack(ENTRY, t, c))
  end
  l.n = l.n + c
  l.changed = true
end

-- RateState -------------------------------------------------------------

local tier_key_head, tier_key_tail = ARGV[10], ARGV[11]

local function tier_key(i)
  return KEYS[4 + i] or (tier_key_head .. i .. tier_key_tail)
end

-- The state, or nil for none.
local function state_decode(raw)
  if not raw then return nil end
  local version, forget, lists_until, p = struct.unpack('<Bdd', raw, 1)
  if version ~= 3 then
    error({ err = 'CHARON bad data: rate state version ' .. version })
  end
  local st = { forget = forget, lists_until = lists_until, tiers = {} }
  st.last, p = log_decode(KEYS[2], raw, p)
  local count
  count, p = struct.unpack('<I4', raw, p)
  for i = 1, count do
    local e
    e, p = struct.unpack('<d', raw, p)
    local ts = { entered = nil }
    if e >= 0 then ts.entered = e end
    ts.hits, p = log_decode(tier_key(i), raw, p)
    st.tiers[i] = ts
  end
  return st
end

local function state_new()
  return { forget = nil, lists_until = 0, last = log_new(KEYS[2]), tiers = {} }
end

local function state_encode(st, forget)
  local parts = { struct.pack('<Bdd', 3, forget, st.lists_until), log_encode(st.last), struct.pack('<I4', #st.tiers) }
  for _, ts in ipairs(st.tiers) do
    parts[#parts + 1] = struct.pack('<d', ts.entered or -1)
    parts[#parts + 1] = log_encode(ts.hits)
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
local st = state_decode(raw)
if not st or (st.forget >= 0 and now_raw >= st.forget) then
  -- No state, or it may be forgotten: start from nothing, and drop what a
  -- forgotten state's lists (which outlive it a little) still hold.
  local count = 0
  if st then count = #st.tiers end
  redis.call('DEL', KEYS[2])
  for i = 1, math.max(#tiers, count) do redis.call('DEL', tier_key(i)) end
  local stored_forget = st and st.forget
  st = state_new()
  st.forget = stored_forget
end
local glog
local graw = redis.call('GET', KEYS[4])
local glists_until = 0
if graw then
  local p
  glists_until, p = struct.unpack('<d', graw, 1)
  glog = log_decode(KEYS[3], graw, p)
else
  redis.call('DEL', KEYS[3])
  glog = log_new(KEYS[3])
end

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

-- charon_core::bound, as decide checks it: the domain's count, then all
-- domains'. A refused grant records nothing; the state is still written
-- back below as on a rejection (the lists were already pruned).
local over = nil
if granted > 0 then
  if not within_bound(st.last.n, granted) then
    over = { 'over', 'd', fmt(st.last.n), fmt(granted) }
  elseif not within_bound(glog.n, granted) then
    over = { 'over', 'g', fmt(glog.n), fmt(granted) }
  end
  if over then granted, recorded = 0, 0 end
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
      st.tiers[i] = { entered = nil, hits = log_new(tier_key(i)) }
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
local function expire_lists(lists, old_until, forget)
  -- (the new "lists expire at")
  local until_ = old_until
  if forget < 0 then
    until_ = -1
  elseif old_until < 0 or forget > old_until then
    until_ = forget + LIST_SLACK
  end
  for _, l in ipairs(lists) do
    if until_ ~= old_until or l.created then
      expire_at(l.key, until_, now_raw, redis_now, slack)
    end
  end
  return until_
end

local forget = forget_at(st, tiers, grace)
local changed = entered_changed or shrank or st.last.changed or forget ~= st.forget
for _, ts in ipairs(st.tiers) do
  changed = changed or ts.hits.changed
end
if raw and changed or granted > 0 then
  if forget >= 0 and forget <= now_raw then
    redis.call('DEL', KEYS[1], KEYS[2])
    for i = 1, #st.tiers do redis.call('DEL', tier_key(i)) end
  else
    local lists = { st.last }
    for _, ts in ipairs(st.tiers) do lists[#lists + 1] = ts.hits end
    st.lists_until = expire_lists(lists, st.lists_until, forget)
    local value = state_encode(st, forget)
    if forget < 0 then
      redis.call('SET', KEYS[1], value)
    else
      redis.call('SET', KEYS[1], value, 'PXAT', fmt(forget - now_raw + redis_now + slack))
    end
  end
end
if glog.changed then
  if glog.n == 0 then
    redis.call('DEL', KEYS[4])
  else
    local forget_g = glog.tail + SECOND + 1
    glists_until = expire_lists({ glog }, glists_until, forget_g)
    redis.call('SET', KEYS[4], struct.pack('<d', glists_until) .. log_encode(glog),
      'PXAT', fmt(forget_g - now_raw + redis_now + slack))
  end
end

if over then return over end

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
