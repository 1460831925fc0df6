-- meter(resource, domain, op): one decision of a bucket, window or queue,
-- a line-by-line port of charon_core::meter::decide (SPEC §7-10) over the
-- levels of meter_drain.lua and meter_window.lua. The differential test
-- (crates/store/tests/meters_differential.rs) holds the two together.
--
-- KEYS[1]  the pair's state (string, see below)
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2]  expiry slack (ms)
-- ARGV[3]  kind: 'b' bucket, 'q' queue, 'w' window
-- ARGV[4..7]  b, q: ticks per unit, ticks per ms, capacity, most ticks ahead
--             w: limit, window (ms), most hits kept, 1 = sliding_counter
--             (0 = fixed)
-- ARGV[8]  soft limit percent (0 = none)     ARGV[9]  ban (ms, 0 = none)
-- ARGV[10] op: 'r' request, 'd' dry run, 'c' charge, 'f' refund
-- ARGV[11] copies                            ARGV[12] min_copies
--
-- Client errors that do not depend on the state (a charge of 0, a refund
-- on a window) are refused by the Rust side before the call.
--
-- State: '<kind>:<level>' with ';<ban end>' when a ban was set, the level
-- 'ms,frac' (b, q) or 'index,curr,prev' (w), empty when only a ban is
-- kept. Written only on a grant, a charge, a refund or a new ban, and
-- set to expire (PXAT) when it no longer changes a decision. Under a test
-- clock only, '@<forget time>' follows (see below).
--
-- Reply: {granted, limit, remaining, reset_after_ms, retry_after_ms
--         (-1 = never), warning, banned, delay_ms (-1 = none)}, or
--        {'refused', state, now}: a charge whose debt would not be kept
--        exactly; nothing changed, and the Rust side asks core for the
--        error on the same state at the same time.

local now, redis_now = clock(ARGV[1])
local slack = tonumber(ARGV[2])
local kind = ARGV[3]
local a1, a2, a3, a4 = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local soft = tonumber(ARGV[8])
local ban_ms = tonumber(ARGV[9])
local op = ARGV[10]
local copies = tonumber(ARGV[11])
local min_copies = tonumber(ARGV[12])

local K
if kind == 'b' or kind == 'q' then
  K = drain_level(kind, a1, a2, a3, a4)
else
  K = window_level(a4 == 1, a1, a2, a3)
end

-- The stored state; a state of another kind is no state.
local raw = redis.call('GET', KEYS[1])
local level, ban = nil, nil
-- The value this decision read a state from ('' if none).
local read = ''
if raw then
  local k, rest = string.match(raw, '^(%a):(.*)$')
  -- Under a test clock keys expire a day late (the slack), so the value
  -- carries its forget time ('@<ms>') and is no state from then on, as
  -- the key would be gone with Redis TIME.
  local body, written_forget = string.match(rest or '', '^(.*)@(%d+)$')
  if body then
    rest = body
    if now >= tonumber(written_forget) then k = nil end
  end
  if k == kind then
    read = raw
    local lv, b = string.match(rest, '^([^;]*);(%d+)$')
    if not lv then lv = rest end
    if b then ban = tonumber(b) end
    if lv ~= '' then
      level = K.decode(lv)
      if not level then
        error({ err = 'CHARON bad data: meter state ' .. raw })
      end
    end
  end
end

local banned = ban ~= nil and now < ban
if level and K.forget_at(level) <= now then level = nil end

-- The state to write: {level, ban}, or nil for no write.
local write = nil
local granted, after, min, new_ban, delay
if op == 'r' or op == 'd' then
  local fit = nil
  if not banned then
    local n = math.min(copies, K.room(level, now))
    if n >= min_copies then fit = n end
  end
  if fit then
    after = K.take(level, now, fit)
    delay = K.delay(level, now)
    if op == 'r' then write = { level = after, ban = ban } end
    granted = fit
  else
    if not banned and ban_ms > 0 then new_ban = now + ban_ms end
    if new_ban and op == 'r' then write = { level = level, ban = new_ban } end
    delay = K.delay(level, now)
    if delay then delay = 0 end
    granted, after = 0, level
  end
  min = min_copies
elseif op == 'c' then
  after = K.charge(level, now, copies)
  if not after then return { 'refused', read, fmt(now) } end
  delay = K.delay(level, now)
  write = { level = after, ban = ban }
  granted, min = copies, 1
else
  after = K.refund(level, now, copies)
  write = { level = after, ban = ban }
  granted, min = copies, 1
end

-- State::pruned, then SET with its forget time or DEL.
if write then
  local lv, b = write.level, write.ban
  if lv and K.forget_at(lv) <= now then lv = nil end
  if b and b <= now then b = nil end
  local forget = 0
  if lv then forget = K.forget_at(lv) end
  if b and b > forget then forget = b end
  if forget <= now then
    redis.call('DEL', KEYS[1])
  else
    local value = kind .. ':'
    if lv then value = value .. K.encode(lv) end
    if b then value = value .. ';' .. fmt(b) end
    if slack > 0 then value = value .. '@' .. fmt(forget) end
    redis.call('SET', KEYS[1], value, 'PXAT', fmt(forget - now + redis_now + slack))
  end
end

-- meter::context
local ban_until = new_ban
if not ban_until and banned then ban_until = ban end
local limit = K.limit()
local remaining = K.remaining(after, now)
local retry
if ban_until and now < ban_until then
  local left = ban_until - now
  retry = K.retry_after(after, now + left, min)
  if retry then retry = left + retry end
else
  retry = K.retry_after(after, now, min)
end
local warning = 0
if soft > 0 then
  local q, r = math.floor(limit / 100), limit % 100
  local threshold = soft * q + ceil_div(soft * r, 100)
  if limit - math.min(remaining, limit) >= threshold then warning = 1 end
end
local banned_flag = 0
if ban_until then banned_flag = 1 end

return {
  fmt(granted), fmt(limit), fmt(remaining), fmt(K.reset_after(after, now)),
  fmt(retry or -1), warning, banned_flag, fmt(delay or -1),
}
