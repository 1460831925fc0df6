-- The level of a bucket (kind 'b') and of a queue (kind 'q'): a port of
-- charon_core::drain, bucket and queue (see docs/algorithms.md, "Buckets
-- and queues: ticks"). After common.lua; meter_op.lua uses it.
--
-- A level is a mark {ms, frac}, the time ms + frac / C; `d` is the ticks
-- from `now` to it. Every value is an integer below 2^53 (the bounds of
-- bucket::Params::new and queue::Params::new), so doubles are exact:
-- floor(a / b) of two such integers is exact, and so is a % b.

-- ceil(a / b) for a >= 0, b > 0 (charon_core::meter::ceil_div).
local function ceil_div(a, b)
  local q = math.floor(a / b)
  if a % b ~= 0 then q = q + 1 end
  return q
end

local function drain_level(kind, P, C, CAP, MAX_AHEAD)
  local FULL = CAP * P
  local L = { kind = kind }

  -- Drain::ahead
  local function ahead(m, now)
    if not m then return 0 end
    local ms, frac = m.ms, m.frac
    if frac >= C then ms, frac = ms + 1, 0 end
    if ms < now then return 0 end
    local d = (ms - now) * C + frac
    if d > MAX_AHEAD then d = MAX_AHEAD end
    return d
  end

  -- Drain::mark
  local function mark(now, d)
    return { ms = now + math.floor(d / C), frac = d % C }
  end

  local function room(d)
    if d >= FULL then return 0 end
    return math.floor((FULL - d) / P)
  end

  local function until_empty(d)
    return ceil_div(d, C)
  end

  function L.limit() return CAP end

  function L.room(s, now) return room(ahead(s, now)) end

  function L.take(s, now, n) return mark(now, ahead(s, now) + n * P) end

  -- nil when the debt could not be kept exactly (Drain::charge).
  function L.charge(s, now, n)
    local d = ahead(s, now)
    if n > math.floor((MAX_AHEAD - d) / P) then return nil end
    return mark(now, d + n * P)
  end

  -- Buckets only (Rust refuses a refund on a queue before the call).
  function L.refund(s, now, n)
    local d = ahead(s, now)
    if n > math.floor(d / P) then return nil end
    d = d - n * P
    if d > 0 then return mark(now, d) end
    return nil
  end

  L.remaining = L.room

  function L.reset_after(s, now) return until_empty(ahead(s, now)) end

  -- nil is never.
  function L.retry_after(s, now, min)
    if min > CAP then return nil end
    local d = ahead(s, now)
    local need = d - (FULL - min * P)
    if need < 0 then need = 0 end
    return ceil_div(need, C)
  end

  function L.forget_at(m)
    if m.frac == 0 then return m.ms end
    return m.ms + 1
  end

  -- Queues: the wait before the first admitted unit (F before the grant).
  function L.delay(s, now)
    if kind ~= 'q' then return nil end
    return until_empty(ahead(s, now))
  end

  function L.decode(text)
    local ms, frac = string.match(text, '^(%d+),(%d+)$')
    if not ms then return nil end
    return { ms = tonumber(ms), frac = tonumber(frac) }
  end

  function L.encode(m)
    return fmt(m.ms) .. ',' .. fmt(m.frac)
  end

  return L
end
