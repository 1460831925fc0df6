-- The level of a window (kind 'w'): a port of charon_core::window (see
-- docs/algorithms.md, "Windows"). After common.lua; meter_op.lua uses it.
--
-- A level is the counts {index, curr, prev} of the aligned window `index`
-- (first_hit: index is the start of the window, its first hit).
-- prev × (W − e) ≤ max_count × W ≤ 2^53 − 1 (window::Params::new), so the
-- estimate is exact in doubles.

-- algorithm: 0 fixed, 1 sliding_counter, 2 first_hit.
local function window_level(algorithm, LIMIT, W, MAX_KEPT)
  local L = { kind = 'w' }
  local sliding, first_hit = algorithm == 1, algorithm == 2

  -- Params::view: {curr, prev, e}
  local function view(s, now)
    if first_hit then
      if s and now < s.index + W then return s.curr, 0, math.max(now - s.index, 0) end
      return 0, 0, 0
    end
    local k, e = math.floor(now / W), now % W
    local curr, prev = 0, 0
    if s and s.index >= k then
      curr, prev = s.curr, s.prev
    elseif s and s.index + 1 == k then
      curr, prev = 0, s.curr
    end
    if not sliding then prev = 0 end
    return curr, prev, e
  end

  local function estimate(curr, prev, e)
    return curr + math.floor(prev * (W - e) / W)
  end

  local function counts(s, now, curr, prev)
    if first_hit then
      local start = now
      if s and now < s.index + W then start = s.index end
      return { index = start, curr = curr, prev = 0 }
    end
    local k = math.floor(now / W)
    if s and s.index > k then k = s.index end
    return { index = k, curr = curr, prev = prev }
  end

  function L.limit() return LIMIT end

  function L.room(s, now)
    local est = estimate(view(s, now))
    if est >= LIMIT then return 0 end
    return LIMIT - est
  end

  function L.take(s, now, n)
    local curr, prev = view(s, now)
    return counts(s, now, curr + n, prev)
  end

  -- nil when the window would count more than it keeps exactly.
  function L.charge(s, now, n)
    local curr, prev = view(s, now)
    if n > MAX_KEPT - math.min(curr, MAX_KEPT) then return nil end
    return counts(s, now, curr + n, prev)
  end

  L.remaining = L.room

  -- Params::reset_after: until the estimate stays 0.
  function L.reset_after(s, now)
    if not s then return 0 end
    if not sliding then return math.max(L.forget_at(s) - now, 0) end
    local curr, prev, e = view(s, now)
    local start = now - e
    local weighing, from
    if curr > 0 then
      weighing, from = curr, start + W
    elseif prev > 0 then
      weighing, from = prev, start
    else
      return 0
    end
    return math.max(from + W - math.floor((W - 1) / weighing) - now, 0)
  end

  -- nil is never.
  function L.retry_after(s, now, min)
    if min > LIMIT then return nil end
    local curr, prev, e = view(s, now)
    if first_hit then
      if curr + min <= LIMIT or not s then return 0 end
      return math.max(s.index + W - now, 0)
    end
    local to_next = W - e
    if not sliding then
      if curr + min <= LIMIT then return 0 end
      return to_next
    end
    if curr + min <= LIMIT then
      local r = LIMIT - min - curr
      if prev == 0 then return 0 end
      local s_most = math.floor(((r + 1) * W - 1) / prev)
      if s_most >= to_next then return 0 end
      if s_most >= 1 then return to_next - s_most end
    end
    local r = LIMIT - min
    if curr == 0 then return to_next end
    local s_most = math.floor(((r + 1) * W - 1) / curr)
    return to_next + (W - math.min(s_most, W))
  end

  function L.forget_at(s)
    if s.curr == 0 and s.prev == 0 then return 0 end
    if first_hit then return s.index + W end
    local windows = 1
    if sliding and s.curr ~= 0 then windows = 2 end
    return (s.index + windows) * W
  end

  function L.delay() return nil end

  function L.decode(text)
    local index, curr, prev = string.match(text, '^(%d+),(%d+),(%d+)$')
    if not index then return nil end
    return { index = tonumber(index), curr = tonumber(curr), prev = tonumber(prev) }
  end

  function L.encode(s)
    return fmt(s.index) .. ',' .. fmt(s.curr) .. ',' .. fmt(s.prev)
  end

  return L
end
