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

-- A view log's entries, oldest first, are read from its list lazily, a
-- chunk at a time (LRANGE), then its in-memory hits: the sweep of
-- retry_after and the pruning both consume them from the front, and the
-- first instant that grants is usually near, so most of a long list is
-- never read.
local CHUNK = 64

local function view_load(l)
  local stored = l.n
  for _, e in ipairs(l.extra) do stored = stored - e[2] end
  l.entries, l.first, l.next_index = {}, 1, 0
  l.list_done = l.cleared or stored <= 0
  l.extra_done = false
end

-- Reads more entries; false when there are none left.
local function view_more(l)
  if not l.list_done then
    local raws = rcall('LRANGE', l.key, l.next_index, l.next_index + CHUNK - 1)
    for _, raw in ipairs(raws) do
      local t, c = struct.unpack(ENTRY, raw)
      l.entries[#l.entries + 1] = { t, c }
    end
    l.next_index = l.next_index + #raws
    if #raws < CHUNK then l.list_done = true end
    if #raws > 0 then return true end
  end
  if not l.extra_done then
    l.extra_done = true
    for _, e in ipairs(l.extra) do l.entries[#l.entries + 1] = e end
    return #l.extra > 0
  end
  return false
end

-- The k-th entry of a loaded view log, or nil.
local function view_entry(l, k)
  while k > #l.entries do
    if not view_more(l) then return nil end
  end
  return l.entries[k]
end

-- HitLog::prune on a loaded view log.
local function view_prune(l, now, span)
  while true do
    local e = view_entry(l, l.first)
    if not e or now - e[1] <= span then return end
    l.n = l.n - e[2]
    l.first = l.first + 1
  end
end

local function view_drop(l)
  l.n = 0
  l.dropped = true
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
    elseif not vt.hits.dropped then
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
  -- changes: every instant at which time alone changes the decision, in
  -- increasing order. Each log's exits are already in order (its entries
  -- plus a constant), so they are merged, not sorted: sorting thousands of
  -- instants costs Lua more than the whole sweep.
  local others = { start }
  local sources = {}
  for i, vt in ipairs(v.tiers) do
    local tier = tiers[i]
    view_load(vt.hits)
    if vt.entered then
      if tier.active then
        local ends = { vt.entered + tier.active, vt.entered + tier.active + tier.cooldown }
        for _, t in ipairs(ends) do
          if t > start then others[#others + 1] = t end
        end
      end
      sources[#sources + 1] = { l = vt.hits, i = 1, off = tier.window + 1 }
    end
  end
  -- H's and G's logs change the decision only under a limit: without one
  -- their lists are not read (the instants they would add change nothing).
  for _, lim in ipairs({ { v.last, hard }, { v.glob, global_limit } }) do
    local l = lim[1]
    if lim[2] == INF then
      l.entries, l.first, l.list_done, l.extra_done = {}, 1, true, true
    else
      view_load(l)
      sources[#sources + 1] = { l = l, i = 1, off = SECOND + 1 }
    end
  end
  table.sort(others)
  local function head(src)
    local e = view_entry(src.l, src.i)
    return e and e[1] + src.off
  end
  for _, src in ipairs(sources) do
    while true do
      local t = head(src)
      if not t or t > start then break end
      src.i = src.i + 1
    end
  end
  local oi, prev = 1, nil
  while true do
    local best, from = nil, nil
    if oi <= #others then best, from = others[oi], 0 end
    for k, src in ipairs(sources) do
      local t = head(src)
      if t and (not best or t < best) then best, from = t, k end
    end
    if not best then break end
    if from == 0 then oi = oi + 1 else sources[from].i = sources[from].i + 1 end
    if best ~= prev then
      prev = best
      view_advance(v, tiers, best)
      if room_at(v, tiers, hard, global_limit, best, min) >= min then return best - now end
    end
  end
  return nil
end
