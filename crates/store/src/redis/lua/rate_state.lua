-- The state of rate.lua: charon_core::rate::RateState, its encoding and
-- the rules over it (advance, current_tier, whole_at, forget_at). After
-- rate_log.lua.
--
-- Layout (see docs/redis.md). The state holds the header of each hit log
-- (rate_log.lua); the entries are in lists. A request reads the headers only and
-- touches a list just to add or drop an entry at its ends, so it costs the
-- same however many hits the windows hold (and makes no big Lua string,
-- which is expensive in Redis).
--   header := f64 total | f64 head | f64 tail | f64 tail hits   (40 bytes)
--   state  := u8 version=4 | f64 forget_at (-1 = never)
--             | f64 lists expire at (-1 = never) | f64 ban end (-1 = none)
--             | header last second
--             | u32 tiers | tiers * (f64 entered (-1 = never) | header)
--   global total key := f64 lists expire at | header
-- The state key expires at forget_at; the lists at "lists expire at",
-- which is pushed LIST_SLACK past forget_at whenever forget_at overtakes
-- it, so that lists are not re-expired on every request yet never vanish
-- before their header.

local ACTIVE, COOLDOWN, INACTIVE = 1, 2, 3

-- RateState -------------------------------------------------------------

-- The keys and key names of the operation being decided, set by
-- rate_step (rate.lua has one operation, meters.lua several): the list of
-- the pair's last second, the configured tiers' lists in KEYS from
-- KEYS[kb + 5], and the names of the lists of tiers the configuration no
-- longer has (head .. i .. tail).
local rk = { last = nil, kb = 0, n = 0, head = '', tail = '' }

local function tier_key(i)
  if i <= rk.n then return KEYS[rk.kb + 4 + i] end
  return rk.head .. i .. rk.tail
end

-- The state, or nil for none.
local function state_decode(raw)
  if not raw then return nil end
  local version, forget, lists_until, p = struct.unpack('<Bdd', raw, 1)
  local ban = -1
  if version == 4 then
    ban, p = struct.unpack('<d', raw, p)
  elseif version ~= 3 then
    -- version 3 is version 4 without a ban (before SPEC 10 for tiers)
    error({ err = 'CHARON bad data: rate state version ' .. version })
  end
  local st = { forget = forget, lists_until = lists_until, tiers = {} }
  if ban >= 0 then st.ban = ban end
  st.last, p = log_decode(rk.last, raw, p)
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
  return { forget = nil, lists_until = 0, last = log_new(rk.last), tiers = {} }
end

local function state_encode(st, forget)
  local parts = { struct.pack('<Bddd', 4, forget, st.lists_until, st.ban or -1), log_encode(st.last), struct.pack('<I4', #st.tiers) }
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

-- RateState::advance; returns whether the tier list shrank or a ban ended
-- (the state must be written back).
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
  if st.ban and now >= st.ban then
    st.ban = nil
    shrank = true
  end
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

-- The latest end of the tiers' states, at least `at`: an active tier's
-- end of cooldown; tier 1, once its window is empty, `first(st, ts,
-- tier)`; -1 if a higher tier would stay for ever.
local function tiers_until(st, tiers, at, first)
  for i, ts in ipairs(st.tiers) do
    if i > #tiers then break end
    if ts.entered then
      local tier = tiers[i]
      local until_
      if tier.active then
        until_ = ts.entered + tier.active + tier.cooldown
      elseif i == 1 then
        until_ = first(st, ts, tier)
      else
        return -1
      end
      if until_ > at then at = until_ end
    end
  end
  return at
end

local function whole_first(_, ts, tier)
  local h = log_latest(ts.hits)
  if h then return h + tier.window end
  return 0
end

-- RateState::whole_at: when the pair is whole again if no other hit
-- arrives (every counted hit at the end of its window, no tier active or
-- cooling down; tier 1 active for ever once its window is empty); -1 if
-- never. The ban is not part of it.
local function whole_at(st, tiers)
  local at = 0
  local l = log_latest(st.last)
  if l then at = l + SECOND end
  return tiers_until(st, tiers, at, whole_first)
end

-- RateState::forget_at; -1 is never.
local function forget_at(st, tiers, grace)
  local at = 0
  local l = log_latest(st.last)
  if l then at = l + SECOND + 1 end
  if st.ban and st.ban > at then at = st.ban end
  return tiers_until(st, tiers, at, function(s, _, tier)
    return state_latest(s) + tier.window + 1 + grace
  end)
end

