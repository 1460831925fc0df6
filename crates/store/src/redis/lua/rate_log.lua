-- The hit log of the burst tiers: charon_core::rate::HitLog on a Redis
-- list (after common.lua; followed by rate_state.lua, rate_decide.lua,
-- rate_context.lua and rate_step.lua, which rate.lua and meters.lua share).
--
-- A log of hits is a Redis list of 16-byte entries (f64 time, f64 hits),
-- oldest first, one per millisecond with hits, described by a header kept
-- elsewhere (in the state, see rate_state.lua): total, time of the first
-- entry, time and hits of the last.

local SECOND = 1000

-- Every Redis command of the tiers' rule goes through rcall: redis.call
-- itself in rate.lua (one operation, written as it goes), and the
-- overlay of rate_overlay.lua in meters.lua (a batch, whose writes wait
-- until every operation of it is decided; see ov_call).
local rcall = redis.call

-- expire_at (common.lua) through rcall.
local function rate_expire_at(key, at, now, redis_now, slack)
  if at < 0 or at >= 4503599627370496 then
    rcall('PERSIST', key)
    return
  end
  rcall('PEXPIREAT', key, fmt(at - now + redis_now + slack))
end
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
  rcall('DEL', l.key)
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
    local _, c = struct.unpack(ENTRY, rcall('LPOP', l.key))
    l.n = l.n - c
    l.head = struct.unpack(ENTRY, rcall('LINDEX', l.key, 0))
    l.changed = true
  end
end

-- Records `c` hits at `t` (never earlier than the latest entry); hits of
-- one millisecond share an entry.
local function log_record(l, t, c)
  if c == 0 then return end
  if l.n > 0 and l.tail == t then
    l.tail_n = l.tail_n + c
    rcall('LSET', l.key, -1, struct.pack(ENTRY, t, l.tail_n))
  else
    if l.n == 0 then
      l.head = t
      l.created = true
    end
    l.tail, l.tail_n = t, c
    rcall('RPUSH', l.key, struct.pack(ENTRY, t, c))
  end
  l.n = l.n + c
  l.changed = true
end

