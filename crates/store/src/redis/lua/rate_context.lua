-- The reply context of rate.lua (SPEC 10 for burst tiers): a port of
-- charon_core::rate's context, room_at, retry_after and changes. After
-- rate_decide.lua.
--
-- The context is computed on a "view": the state after the operation in
-- plain tables, with the same fields the rules read (tiers[i].entered,
-- tiers[i].hits.n, last.n, last.tail, ban), so that current_tier, plan and
-- forget_at apply to it unchanged. A view starts from the headers (after a
-- request's or a charge's writes, or before a dry run's, whose hits are
-- then added in memory only); the lists' entries are read (LRANGE) only
-- when retry_after must look past now, which is bounded by the entries the
-- logs hold anyway.

local function view_log(l)
  return { key = l.key, n = l.n, tail = l.tail, extra = {}, cleared = false }
end

local function view_new(st, glog)
  local v = { tiers = {}, last = view_log(st.last), glob = view_log(glog), ban = st.ban }
  for i, ts in ipairs(st.tiers) do
    v.tiers[i] = { entered = ts.entered, hits = view_log(ts.hits) }
  end
  return v
end

-- Hits recorded in the view only (a dry run's).
local function view_record(l, t, c)
  if c == 0 then return end
  l.n = l.n + c
  l.tail = t
  l.extra[#l.extra + 1] = { t, c }
end

local function view_clear(l)
  l.n, l.tail, l.extra, l.cleared = 0, -1, {}, true
end

-- The entries of a view's log, oldest first, read once.
local function view_load(l)
  local entries = {}
  local stored = l.n
  for _, e in ipairs(l.extra) do stored = stored - e[2] end
  if not l.cleared and stored > 0 then
    for _, raw in ipairs(redis.call('LRANGE', l.key, 0, -1)) do
      local t, c = struct.unpack(ENTRY, raw)
      entries[#entries + 1] = { t, c }
    end
  end
  for _, e in ipairs(l.extra) do entries[#entries + 1] = e end
  l.entries, l.first = entries, 1
end

-- HitLog::prune on a loaded view log.
local function view_prune(l, now, span)
  while l.first <= #l.entries and now - l.entries[l.first][1] > span do
    l.n = l.n - l.entries[l.first][2]
    l.first = l.first + 1
  end
end

local function view_drop(l)
  l.n = 0
  l.first = #l.entries + 1
end

-- RateState::advance on a loaded view.
local function view_advance(v, tiers, now)
  for i, vt in ipairs(v.tiers) do
    local ph = phase_of(tiers[i], vt.entered, now)
    if ph == INACTIVE then
      vt.entered = nil
      view_drop(vt.hits)
    elseif ph == COOLDOWN then
      view_drop(vt.hits)
    else
      view_prune(vt.hits, now, tiers[i].window)
    end
  end
  view_prune(v.last, now, SECOND)
  view_prune(v.glob, now, SECOND)
end

-- room_at: how many of `want` hits a request at `now` would be granted.
local function room_at(v, tiers, hard, global_limit, now, want)
  local current = current_tier(v, tiers, now)
  local _, through = plan(v, tiers, current, now, want)
  return math.min(through, room(hard, v.last.n), room(global_limit, v.glob.n))
end

-- retry_after: the first instant, not before a ban's end, at which a dry
-- decision grants `min`, as a wait from now; nil if none.
local function retry_after(v, tiers, hard, global_limit, now, min, ban_until)
  if min > hard or min > global_limit then return nil end
  local start = now
  if ban_until and ban_until > now then start = ban_until end
  if start == now and room_at(v, tiers, hard, global_limit, now, min) >= min then
    return 0
  end
  -- changes: every instant at which time alone changes the decision
  local at = { start }
  local function add(t)
    if t > start then at[#at + 1] = t end
  end
  for i, vt in ipairs(v.tiers) do
    local tier = tiers[i]
    view_load(vt.hits)
    if vt.entered then
      if tier.active then
        add(vt.entered + tier.active)
        add(vt.entered + tier.active + tier.cooldown)
      end
      for _, e in ipairs(vt.hits.entries) do add(e[1] + tier.window + 1) end
    end
  end
  -- H's and G's logs change the decision only under a limit: without one
  -- their lists are not read (the instants they would add change nothing).
  for _, lim in ipairs({ { v.last, hard }, { v.glob, global_limit } }) do
    local l = lim[1]
    if lim[2] == INF then
      l.entries, l.first = {}, 1
    else
      view_load(l)
      for _, e in ipairs(l.entries) do add(e[1] + SECOND + 1) end
    end
  end
  table.sort(at)
  local prev = nil
  for _, t in ipairs(at) do
    if t ~= prev then
      prev = t
      view_advance(v, tiers, t)
      if room_at(v, tiers, hard, global_limit, t, min) >= min then return t - now end
    end
  end
  return nil
end
