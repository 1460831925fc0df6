-- One decision of a bucket, window or queue on a state held in Lua: a
-- line-by-line port of charon_core::meter::decide (SPEC §7-10) over the
-- levels of meter_drain.lua and meter_window.lua. After those two;
-- meters.lua (an all-or-nothing batch holding burst tiers) calls it;
-- single operations and batches of meters alone run the lean port
-- (lean_drain.lua, lean_window.lua). The differential tests (crates/store/tests/store/meters_differential.rs,
-- meters_batch.rs) hold it to core.
--
-- An operation's arguments are 10 strings from ARGV[at]:
--   kind: 'b' bucket, 'q' queue, 'w' window
--   4 parameters: b, q: ticks per unit, ticks per ms, capacity, most ticks
--      ahead; w: limit, window (ms), most hits kept, algorithm (0 fixed,
--      1 sliding_counter, 2 first_hit)
--   soft limit percent (0 = none), ban (ms, 0 = none)
--   op: 'r' request, 'd' dry run, 'c' charge, 'f' refund
--   copies, min_copies
--
-- State: '<kind>:<level>' with ';<ban end>' when a ban was set, the level
-- 'ms,frac' (b, q) or 'index,curr,prev' (w), empty when only a ban is
-- kept. Written only on a grant, a charge, a refund or a new ban, and
-- set to expire (PXAT) when it no longer changes a decision. Under a test
-- clock only, '@<forget time>' follows (see meter_read).

-- The operation whose arguments start at ARGV[at].
local function meter_args(at)
  local m = {
    kind = ARGV[at],
    soft = tonumber(ARGV[at + 5]),
    ban_ms = tonumber(ARGV[at + 6]),
    op = ARGV[at + 7],
    copies = tonumber(ARGV[at + 8]),
    min_copies = tonumber(ARGV[at + 9]),
  }
  local a1, a2, a3, a4 = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
    tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  if m.kind == 'b' or m.kind == 'q' then
    m.K = drain_level(m.kind, a1, a2, a3, a4)
  else
    m.K = window_level(a4, a1, a2, a3)
  end
  return m
end

-- The stored value `raw` (false when none) as {kind, level, ban}; a state
-- of another kind is no state.
local function meter_read(m, raw, now)
  local st = { kind = m.kind }
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
    if k == m.kind then
      local lv, b = string.match(rest, '^([^;]*);(%d+)$')
      if not lv then lv = rest end
      if b then st.ban = tonumber(b) end
      if lv ~= '' then
        st.level = m.K.decode(lv)
        if not st.level then
          error({ err = 'CHARON bad data: meter state ' .. raw })
        end
      end
    end
  end
  return st
end

-- A state as its stored value (without the forget time).
local function meter_encode(m, st)
  if st.kind ~= m.kind then return '' end
  local value = st.kind .. ':'
  if st.level then value = value .. m.K.encode(st.level) end
  if st.ban then value = value .. ';' .. fmt(st.ban) end
  return value
end

-- Decides m on st at now: the reply (8 values, as drain.lua returns them)
-- and the state to write ({kind, level, ban}, nil for no write); nil and
-- nil when core refuses (a charge whose debt would not be kept exactly).
local function meter_decide(m, st, now)
  local K, op, copies, min_copies = m.K, m.op, m.copies, m.min_copies
  local level, ban = nil, nil
  if st.kind == m.kind then level, ban = st.level, st.ban end
  local banned = ban ~= nil and now < ban
  if level and K.forget_at(level) <= now then level = nil end

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
      if not banned and m.ban_ms > 0 then new_ban = now + m.ban_ms end
      if new_ban and op == 'r' then write = { level = level, ban = new_ban } end
      delay = K.delay(level, now)
      if delay then delay = 0 end
      granted, after = 0, level
    end
    min = min_copies
  elseif op == 'c' then
    after = K.charge(level, now, copies)
    if not after then return nil, nil end
    delay = K.delay(level, now)
    write = { level = after, ban = ban }
    granted, min = copies, 1
  else
    after = K.refund(level, now, copies)
    write = { level = after, ban = ban }
    granted, min = copies, 1
  end
  if write then write.kind = m.kind end

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
  if m.soft > 0 then
    local q, r = math.floor(limit / 100), limit % 100
    local threshold = m.soft * q + ceil_div(m.soft * r, 100)
    if limit - math.min(remaining, limit) >= threshold then warning = 1 end
  end
  local banned_flag = 0
  if ban_until then banned_flag = 1 end

  return {
    fmt(granted), fmt(limit), fmt(remaining), fmt(K.reset_after(after, now)),
    fmt(retry or -1), warning, banned_flag, fmt(delay or -1),
  }, write
end

-- State::pruned, then SET with its forget time or DEL.
local function meter_store(key, m, write, now, redis_now, slack)
  local K = m.K
  local lv, b = write.level, write.ban
  if lv and K.forget_at(lv) <= now then lv = nil end
  if b and b <= now then b = nil end
  local forget = 0
  if lv then forget = K.forget_at(lv) end
  if b and b > forget then forget = b end
  if forget <= now then
    redis.call('DEL', key)
  else
    local value = meter_encode(m, { kind = m.kind, level = lv, ban = b })
    if slack > 0 then value = value .. '@' .. fmt(forget) end
    redis.call('SET', key, value, 'PXAT', fmt(forget - now + redis_now + slack))
  end
end
