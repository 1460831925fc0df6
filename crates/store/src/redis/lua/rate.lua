-- request(resource, domain, copies, min_copies): a line-by-line port of
-- charon_core::rate::decide (SPEC §2 rules 1-6) and RateState::forget_at.
-- The differential test (tests/differential.rs) holds the two together.
--
-- KEYS[1]  the (resource, domain) pair's state
-- KEYS[2]  the resource's hits in the last second, across domains (for G)
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2] expiry slack (ms)
-- ARGV[3]  DORMANT_GRACE                     ARGV[4] copies
-- ARGV[5]  min_copies                        ARGV[6] 1 = enforce, 0 = ignore
-- ARGV[7]  H ('' = none)                     ARGV[8] G ('' = none)
-- ARGV[9]  number of tiers, then five per tier:
--          limit (-1 = unbounded), window, active (-1 = infinite),
--          cooldown, skippable (1/0)
--
-- Reply: {granted, domain_hits_last_second, global_hits_last_second,
--         tier_hits, tier, burst, hard_limited, global_limited}
--
-- Encoding (little-endian, see docs/redis.md):
--   log   := f64 total | u32 entries | entries * (f64 time, f64 hits)
--   pair  := u8 version=1 | f64 forget_at (-1 = never) | log last_second
--            | u32 tiers | tiers * (f64 entered (-1 = never) | log hits)
--   global key := log

local SECOND = 1000
local ENTRY = 16
local ACTIVE, COOLDOWN, INACTIVE = 1, 2, 3

-- HitLog ------------------------------------------------------------------

local function log_new()
  return { n = 0, s = '' }
end

local function log_latest(l)
  if #l.s == 0 then return nil end
  return (struct.unpack('<d', l.s, #l.s - ENTRY + 1))
end

-- Forgets hits that fell out of a window of `span` ending at `now` (closed
-- on the left: a hit at t stays while now - t <= span). Entries are in
-- time order, so the first one to keep is found by bisection.
local function log_prune(l, now, span)
  local k = #l.s / ENTRY
  if k == 0 then return end
  local lo, hi = 0, k
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local t = struct.unpack('<d', l.s, mid * ENTRY + 1)
    if now - t <= span then hi = mid else lo = mid + 1 end
  end
  if lo == 0 then return end
  local dropped = 0
  for i = 0, lo - 1 do
    local _, c = struct.unpack('<dd', l.s, i * ENTRY + 1)
    dropped = dropped + c
  end
  l.n = l.n - dropped
  l.s = string.sub(l.s, lo * ENTRY + 1)
end

-- Records `c` hits at `t` (never earlier than the latest entry); hits of
-- one millisecond share an entry.
local function log_record(l, t, c)
  if c == 0 then return end
  local len = #l.s
  if len > 0 then
    local lt, lc = struct.unpack('<dd', l.s, len - ENTRY + 1)
    if lt == t then
      l.s = string.sub(l.s, 1, len - ENTRY) .. struct.pack('<dd', t, lc + c)
      l.n = l.n + c
      return
    end
  end
  l.s = l.s .. struct.pack('<dd', t, c)
  l.n = l.n + c
end

local function log_clear(l)
  l.n = 0
  l.s = ''
end

local function log_encode(l)
  return struct.pack('<dI4', l.n, #l.s / ENTRY) .. l.s
end

local function log_decode(raw, p)
  local n, k
  n, k, p = struct.unpack('<dI4', raw, p)
  local e = p + k * ENTRY
  return { n = n, s = string.sub(raw, p, e - 1) }, e
end

-- RateState ---------------------------------------------------------------

local function state_new()
  return { last = log_new(), tiers = {} }
end

-- (state, stored forget_at): forget_at is nil when there was no state.
local function state_decode(raw)
  if not raw then return state_new(), nil end
  local version, forget, p = struct.unpack('<Bd', raw, 1)
  if version ~= 1 then
    error({ err = 'CHARON bad data: rate state version ' .. version })
  end
  local st = state_new()
  st.last, p = log_decode(raw, p)
  local count
  count, p = struct.unpack('<I4', raw, p)
  for i = 1, count do
    local e
    e, p = struct.unpack('<d', raw, p)
    local ts = { entered = nil }
    if e >= 0 then ts.entered = e end
    ts.hits, p = log_decode(raw, p)
    st.tiers[i] = ts
  end
  return st, forget
end

local function state_encode(st, forget)
  local parts = { struct.pack('<Bd', 1, forget), log_encode(st.last), struct.pack('<I4', #st.tiers) }
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

-- RateState::advance
local function advance(st, tiers, now)
  for i = #st.tiers, #tiers + 1, -1 do st.tiers[i] = nil end
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
  end
  log_prune(st.last, now, SECOND)
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
  local b = 9 + (i - 1) * 5
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
local st, stored_forget = state_decode(raw)
if stored_forget and stored_forget >= 0 and now_raw >= stored_forget then
  st = state_new()
end
local had_tiers = #st.tiers
local glog = log_new()
local graw = redis.call('GET', KEYS[2])
if graw then glog = log_decode(graw, 1) end

-- A clock that stepped back must not put recorded hits in the future.
local now = math.max(now_raw, state_latest(st), log_latest(glog) or 0)
advance(st, tiers, now)
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
if granted > 0 then
  local left = recorded
  for _, step in ipairs(steps) do
    if left == 0 then break end
    local take = math.min(step.take, left)
    for i = #st.tiers + 1, step.tier do
      st.tiers[i] = { entered = nil, hits = log_new() }
    end
    local ts = st.tiers[step.tier]
    if step.enter then
      ts.entered = now
      log_clear(ts.hits)
      burst = true
    end
    log_record(ts.hits, now, take)
    left = left - take
    tier = step.tier
  end
  log_record(st.last, now, granted)
  log_record(glog, now, granted)
end

-- Store what changed. A rejection changes nothing a decision can see; it
-- is written back only when it moves the time from which the state may be
-- forgotten (or dropped tiers that no longer exist), so that Redis forgets
-- exactly when the in-memory store would.
local forget = forget_at(st, tiers, grace)
if granted > 0 or (raw and (forget ~= stored_forget or had_tiers > #tiers)) then
  if forget >= 0 and forget <= now_raw then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], state_encode(st, forget))
    if forget >= 0 then expire_at(KEYS[1], forget, now_raw, redis_now, slack) end
  end
end
if granted > 0 then
  redis.call('SET', KEYS[2], log_encode(glog))
  expire_at(KEYS[2], now + SECOND + 1, now_raw, redis_now, slack)
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
