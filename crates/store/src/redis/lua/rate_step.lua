-- One operation on a pair of burst tiers (request, dry run or charge): a
-- line-by-line port of charon_core::rate::decide_op (SPEC §2 rules 1-6,
-- SPEC §10: reply context, soft limit, ban, dry run, charge) and
-- RateState::forget_at, written once and run by rate.lua (one operation)
-- and meters.lua (an all-or-nothing batch). After rate_context.lua.
-- The differential tests (crates/limiter/tests/limiter/differential.rs for
-- rate.lua, crates/store/tests/store/meters_differential.rs for the batch) hold
-- it to core.
--
-- rate_step(kb, ab, now_raw, redis_now, slack) reads its keys from
-- KEYS[kb + 1] and its arguments from ARGV[ab + 3] on, laid out as rate.lua
-- documents them with kb = ab = 0; the clock and the expiry slack are
-- given (one reading for a whole batch). It reads, decides and writes
-- through rcall (rate_log.lua): straight to Redis in rate.lua, to the
-- batch's overlay in meters.lua. It returns the reply or the 'over' table
-- rate.lua documents; on 'over' what time alone made irrelevant is still
-- written, as on a rejection.

local LIST_SLACK = 60000

local function rate_step(kb, ab, now_raw, redis_now, slack)
  local KEY_STATE, KEY_LAST, KEY_GLOB, KEY_GTOTAL = KEYS[kb + 1], KEYS[kb + 2], KEYS[kb + 3], KEYS[kb + 4]
  rk = { last = KEY_LAST, kb = kb, n = tonumber(ARGV[ab + 9]), head = ARGV[ab + 10], tail = ARGV[ab + 11] }
  local grace = tonumber(ARGV[ab + 3])
  local copies = tonumber(ARGV[ab + 4])
  local min_copies = tonumber(ARGV[ab + 5])
  local enforce = ARGV[ab + 6] == '1'
  local hard = optional_limit_arg(ARGV[ab + 7])
  local global_limit = optional_limit_arg(ARGV[ab + 8])
  local op = ARGV[ab + 12]
  local soft = tonumber(ARGV[ab + 13])
  local ban_ms = tonumber(ARGV[ab + 14])
  local tiers = {}
  for i = 1, tonumber(ARGV[ab + 9]) do
    local b = 14 + (i - 1) * 5
    local active = tonumber(ARGV[ab + b + 3])
    if active < 0 then active = nil end
    tiers[i] = {
      limit = limit_arg(ARGV[ab + b + 1]),
      window = tonumber(ARGV[ab + b + 2]),
      active = active,
      cooldown = tonumber(ARGV[ab + b + 4]),
      skippable = ARGV[ab + b + 5] == '1',
    }
  end

  local raw = rcall('GET', KEY_STATE)
  local st = state_decode(raw)
  if not st or (st.forget >= 0 and now_raw >= st.forget) then
    -- No state, or it may be forgotten: start from nothing, and drop what a
    -- forgotten state's lists (which outlive it a little) still hold.
    local count = 0
    if st then count = #st.tiers end
    rcall('DEL', KEY_LAST)
    for i = 1, math.max(#tiers, count) do rcall('DEL', tier_key(i)) end
    local stored_forget = st and st.forget
    st = state_new()
    st.forget = stored_forget
  end
  local glog
  local graw = rcall('GET', KEY_GTOTAL)
  local glists_until = 0
  if graw then
    local p
    glists_until, p = struct.unpack('<d', graw, 1)
    glog = log_decode(KEY_GLOB, graw, p)
  else
    rcall('DEL', KEY_GLOB)
    glog = log_new(KEY_GLOB)
  end

  -- A clock that stepped back must not put recorded hits in the future.
  local now = math.max(now_raw, state_latest(st), log_latest(glog) or 0)
  local shrank = advance(st, tiers, now)
  log_prune(glog, now, SECOND)
  local current = current_tier(st, tiers, now)

  local banned_before = st.ban ~= nil -- advance dropped an ended ban
  local granted, recorded = 0, 0
  local hard_limited, global_limited = false, false
  local steps = {}
  local over = nil
  local new_ban = false

  if op == 'c' then
    -- charge: never rejected, recorded in the current tier (no burst), H's
    -- and G's logs; the bound as decide_op checks it: domain, all domains,
    -- the tier.
    if not within_bound(st.last.n, copies) then
      over = { 'over', 'd', fmt(st.last.n), fmt(copies) }
    elseif not within_bound(glog.n, copies) then
      over = { 'over', 'g', fmt(glog.n), fmt(copies) }
    elseif not within_bound(tier_hits(st, current), copies) then
      over = { 'over', 't', fmt(tier_hits(st, current)), fmt(copies) }
    else
      granted = copies
      if current >= 1 then steps[1] = { tier = current, take = copies, enter = false } end
      recorded = copies
    end
  elseif enforce and banned_before then
    -- a request during a ban: rejected, nothing changes
  else
    local through_tiers
    steps, through_tiers = plan(st, tiers, current, now, copies)
    local wish = math.min(copies, through_tiers)
    local hard_room = room(hard, st.last.n)
    local global_room = room(global_limit, glog.n)
    hard_limited = hard_room < wish and hard_room <= global_room
    global_limited = global_room < wish and global_room <= hard_room

    if enforce then
      local n = math.min(copies, wish, hard_room, global_room)
      if n >= min_copies then granted, recorded = n, n end
    else
      granted, recorded = copies, wish
    end

    -- charon_core::bound, as decide checks it: the domain's count, then all
    -- domains'. A refused grant records nothing; the state is still written
    -- back below as on a rejection (the lists were already pruned).
    if granted > 0 then
      if not within_bound(st.last.n, granted) then
        over = { 'over', 'd', fmt(st.last.n), fmt(granted) }
      elseif not within_bound(glog.n, granted) then
        over = { 'over', 'g', fmt(glog.n), fmt(granted) }
      end
      if over then granted, recorded = 0, 0 end
    end
    if granted == 0 and enforce and not over and ban_ms > 0 then new_ban = true end
  end
  if op == 'c' then min_copies = 1 end

  -- Apply the steps: to the state (and lists) for a request or a charge, to
  -- a view only for a dry run (see rate_context.lua).
  local dry = op == 'd'
  local view = nil
  if dry then view = view_new(st, glog) end
  local tier = current
  local burst = false
  local entered_changed = false
  if granted > 0 then
    local left = recorded
    for _, step in ipairs(steps) do
      if left == 0 then break end
      local take = math.min(step.take, left)
      if dry then
        for i = #view.tiers + 1, step.tier do
          view.tiers[i] = { entered = nil, hits = view_log(log_new(tier_key(i))) }
        end
        local vt = view.tiers[step.tier]
        if step.enter then
          vt.entered = now
          view_clear(vt.hits)
          burst = true
        end
        view_record(vt.hits, now, take)
      else
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
      end
      left = left - take
      tier = step.tier
    end
    if dry then
      view_record(view.last, now, granted)
      view_record(view.glob, now, granted)
    else
      log_record(st.last, now, granted)
      log_record(glog, now, granted)
    end
  end
  if new_ban then
    if dry then view.ban = now + ban_ms else st.ban = now + ban_ms end
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
        rate_expire_at(l.key, until_, now_raw, redis_now, slack)
      end
    end
    return until_
  end

  local forget = forget_at(st, tiers, grace)
  local changed = entered_changed or shrank or st.last.changed or forget ~= st.forget
  for _, ts in ipairs(st.tiers) do
    changed = changed or ts.hits.changed
  end
  if raw and changed or (granted > 0 and not dry) or (new_ban and not dry) then
    if forget >= 0 and forget <= now_raw then
      rcall('DEL', KEY_STATE, KEY_LAST)
      for i = 1, #st.tiers do rcall('DEL', tier_key(i)) end
    else
      local lists = { st.last }
      for _, ts in ipairs(st.tiers) do lists[#lists + 1] = ts.hits end
      st.lists_until = expire_lists(lists, st.lists_until, forget)
      local value = state_encode(st, forget)
      if forget < 0 then
        rcall('SET', KEY_STATE, value)
      else
        rcall('SET', KEY_STATE, value, 'PXAT', fmt(forget - now_raw + redis_now + slack))
      end
    end
  end
  if glog.changed then
    if glog.n == 0 then
      rcall('DEL', KEY_GTOTAL)
    else
      local forget_g = glog.tail + SECOND + 1
      glists_until = expire_lists({ glog }, glists_until, forget_g)
      rcall('SET', KEY_GTOTAL, struct.pack('<d', glists_until) .. log_encode(glog),
        'PXAT', fmt(forget_g - now_raw + redis_now + slack))
    end
  end

  if over then return over end

  -- The reply context (charon_core::rate's context), on the state after the
  -- operation (as if applied, for a dry run).
  if not view then view = view_new(st, glog) end
  -- (read before retry_after moves the view forward in time)
  local out_last, out_glob, out_tier = view.last.n, view.glob.n, tier_hits(view, tier)
  local ban_until = nil
  if view.ban and now < view.ban then ban_until = view.ban end
  local vcurrent = current_tier(view, tiers, now)
  local vlimit = 0
  if vcurrent >= 1 then vlimit = tiers[vcurrent].limit end
  local warning = 0
  if soft > 0 and vcurrent >= 1 and vlimit <= MAX_COUNT then
    local q, r = math.floor(vlimit / 100), vlimit % 100
    local threshold = soft * q + math.floor((soft * r + 99) / 100)
    if math.min(tier_hits(view, vcurrent), vlimit) >= threshold then warning = 1 end
  end
  local remaining = room_at(view, tiers, hard, global_limit, now, INF)
  if remaining > MAX_COUNT then remaining = -1 end
  local vwhole = whole_at(view, tiers)
  local reset = -1
  if vwhole >= 0 then reset = math.max(vwhole - now, 0) end
  local retry = retry_after(view, tiers, hard, global_limit, now, min_copies, ban_until)
  local banned_flag = 0
  if ban_until then banned_flag = 1 end

  local function flag(b)
    if b then return 1 end
    return 0
  end

  return {
    fmt(granted),
    fmt(out_last),
    fmt(out_glob),
    fmt(out_tier),
    tier,
    flag(burst),
    flag(hard_limited),
    flag(global_limited),
    fmt(remaining),
    fmt(reset),
    fmt(retry or -1),
    warning,
    banned_flag,
  }
end
