-- One decision of a bucket ('b') or a queue ('q'), lean: the same rule,
-- arguments, reply and stored value as meter_op.lua with
-- meter_drain.lua (a port of charon_core::meter::decide over
-- charon_core::drain), written flat for the hot path: a level is two
-- numbers (ms, frac; ms nil for none), no table or closure is made per
-- call, and nothing but the one GET, the decision and the one SET (or DEL)
-- is done. drain.lua runs it for one operation and meter_batch.lua for
-- each operation of a batch; the differential tests
-- (crates/store/tests/store/meters_differential.rs, batched_redis.rs) hold it to
-- core, and their deliberate mutations of it must fail them.
--
-- drain_op(raw, a, now, slack): the operation whose arguments are
-- ARGV[a .. a + 9] (meter_op.lua's ten) on the stored value `raw` (false
-- for none), decided at `now`. Returns the reply, then what to store: nil
-- (no write), false (DEL) or the value, and then its forget time (decision
-- clock). A refusal (a charge whose debt would not be kept exactly) is
-- {'refused', state, now} with nothing to store.

-- Drain::ahead: the ticks from t to the mark (m, f); none is 0.
local function drain_ahead(m, f, t, C, MAX_AHEAD)
  if not m then return 0 end
  if f >= C then m, f = m + 1, 0 end
  if m < t then return 0 end
  local d = (m - t) * C + f
  if d > MAX_AHEAD then d = MAX_AHEAD end
  return d
end

local function drain_op(raw, a, now, slack)
  local kind = ARGV[a]
  local P, C, CAP, MAX_AHEAD = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local soft, ban_ms, op = tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), ARGV[a + 7]
  local copies, min = tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9])
  local FULL = CAP * P

  -- The stored value: '<kind>:<ms>,<frac>' and ';<ban end>' when a ban is
  -- kept; under a test clock only, '@<forget time>' (lean_value,
  -- lean_store.lua).
  local ms, frac, ban, rms, rfrac, rban = nil, 0, nil, nil, 0, nil
  local lv
  lv, ban = lean_value(raw, kind, now)
  if lv and lv ~= '' then
    local m, f = string.match(lv, '^(%d+),(%d+)$')
    if not m then error({ err = 'CHARON bad data: meter state ' .. raw }) end
    ms, frac = tonumber(m), tonumber(f)
  end
  rms, rfrac, rban = ms, frac, ban

  local banned = ban ~= nil and now < ban
  -- State::pruned: a level past its forget time is none.
  if ms and (frac == 0 and ms or ms + 1) <= now then ms, frac = nil, 0 end

  local d = drain_ahead(ms, frac, now, C, MAX_AHEAD)
  local granted, after, new_ban, delay
  local write = false
  local ams, afrac = nil, 0
  if op == 'r' or op == 'd' then
    local fit = nil
    if not banned then
      local room = 0
      if d < FULL then room = math.floor((FULL - d) / P) end
      local n = math.min(copies, room)
      if n >= min then fit = n end
    end
    if kind == 'q' then delay = math.floor(d / C); if d % C ~= 0 then delay = delay + 1 end end
    if fit then
      local t = d + fit * P
      ams, afrac = now + math.floor(t / C), t % C
      if op == 'r' then write = true end
      granted = fit
    else
      if not banned and ban_ms > 0 then new_ban = now + ban_ms end
      if new_ban and op == 'r' then write = true; ban = new_ban end
      if delay then delay = 0 end
      granted, ams, afrac = 0, ms, frac
    end
  elseif op == 'c' then
    if copies > math.floor((MAX_AHEAD - d) / P) then
      local state = kind .. ':'
      if rms then state = state .. string.format('%d', rms) .. ',' .. string.format('%d', rfrac) end
      if rban then state = state .. ';' .. string.format('%d', rban) end
      return { 'refused', state, now }
    end
    local t = d + copies * P
    ams, afrac = now + math.floor(t / C), t % C
    if kind == 'q' then delay = math.floor(d / C); if d % C ~= 0 then delay = delay + 1 end end
    write = true
    granted, min = copies, 1
  else
    -- A refund (buckets only: Rust refuses one on a queue before the call).
    if copies <= math.floor(d / P) then
      local t = d - copies * P
      if t > 0 then ams, afrac = now + math.floor(t / C), t % C end
    end
    write = true
    granted, min = copies, 1
  end

  -- meter::context
  local ban_until = new_ban
  if not ban_until and banned then ban_until = ban end
  local ad = drain_ahead(ams, afrac, now, C, MAX_AHEAD)
  local remaining = 0
  if ad < FULL then remaining = math.floor((FULL - ad) / P) end
  local retry = nil
  if min <= CAP then
    local at, extra = now, 0
    if ban_until and now < ban_until then at, extra = ban_until, ban_until - now end
    local need = drain_ahead(ams, afrac, at, C, MAX_AHEAD) - (FULL - min * P)
    if need < 0 then need = 0 end
    retry = math.floor(need / C)
    if need % C ~= 0 then retry = retry + 1 end
    retry = retry + extra
  end
  local warning = 0
  if soft > 0 then
    local r = CAP % 100
    local threshold = soft * math.floor(CAP / 100) + math.floor(soft * r / 100)
    if (soft * r) % 100 ~= 0 then threshold = threshold + 1 end
    if CAP - math.min(remaining, CAP) >= threshold then warning = 1 end
  end
  local banned_flag = 0
  if ban_until then banned_flag = 1 end
  local reset = math.floor(ad / C)
  if ad % C ~= 0 then reset = reset + 1 end
  -- Numbers travel as integer replies (exact below 2^53; Rust reads both).
  local reply = { granted, CAP, remaining, reset, retry or -1, warning, banned_flag, delay or -1 }
  if not write then return reply, nil, 0 end

  -- State::pruned, then the value with its forget time, or none.
  local forget = 0
  if ams then
    forget = afrac == 0 and ams or ams + 1
    if forget <= now then ams, forget = nil, 0 end
  end
  if ban and ban <= now then ban = nil end
  if ban and ban > forget then forget = ban end
  if forget <= now then return reply, false, 0 end
  local value = kind .. ':'
  if ams then value = value .. string.format('%d', ams) .. ',' .. string.format('%d', afrac) end
  if ban then value = value .. ';' .. string.format('%d', ban) end
  if slack > 0 then value = value .. '@' .. string.format('%d', forget) end
  return reply, value, forget
end
