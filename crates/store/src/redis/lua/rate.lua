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
-- The script is common.lua, rate_log.lua (hit logs), rate_state.lua (the
-- pair's state), rate_decide.lua (the tier plan) and this file (arguments,
-- H and G, the bound, storing what changed), concatenated.

local LIST_SLACK = 60000

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
