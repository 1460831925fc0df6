-- One decision of a window ('w'), lean: the same rule, arguments, reply
-- and stored value as meter_op.lua with meter_window.lua (a port of
-- charon_core::meter::decide over charon_core::window), written flat for
-- the hot path: a level is three numbers (index, curr, prev; index nil for
-- none), no table or closure is made per call beyond the reply. window.lua
-- runs it for one operation and meter_batch.lua for each operation of a
-- batch; the differential tests hold it to core, and their deliberate
-- mutations of it must fail them.
--
-- window_op(raw, a, now, slack): as drain_op (lean_drain.lua), for the
-- arguments ARGV[a .. a + 9]: 'w', limit, window (ms), most hits kept,
-- algorithm (0 fixed, 1 sliding_counter, 2 first_hit), soft limit percent,
-- ban (ms), op ('r', 'd', 'c'; Rust refuses a refund before the call),
-- copies, min_copies.

local function window_op(raw, a, now, slack)
  local LIMIT, W, MAX_KEPT = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local algorithm = ARGV[a + 4]
  local sliding, first_hit = algorithm == '1', algorithm == '2'
  local soft, ban_ms, op = tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), ARGV[a + 7]
  local copies, min = tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9])

  -- The stored value: 'w:<index>,<curr>,<prev>' and ';<ban end>'; under a
  -- test clock only, '@<forget time>' (lean_value, lean_store.lua).
  local si, sc, sp, ban = nil, 0, 0, nil
  local lv
  lv, ban = lean_value(raw, 'w', now)
  if lv and lv ~= '' then
    local i, c, p = string.match(lv, '^(%d+),(%d+),(%d+)$')
    if not i then error({ err = 'CHARON bad data: meter state ' .. raw }) end
    si, sc, sp = tonumber(i), tonumber(c), tonumber(p)
  end
  local ri, rc, rp, rban = si, sc, sp, ban

  -- Params::forget_at of a level.
  local function forget_at(i, c, p)
    if c == 0 and p == 0 then return 0 end
    if first_hit then return i + W end
    if sliding and c ~= 0 then return (i + 2) * W end
    return (i + 1) * W
  end

  -- Params::view: curr, prev and the time e into the window at t.
  local function view(i, c, p, t)
    if first_hit then
      if i and t < i + W then return c, 0, math.max(t - i, 0) end
      return 0, 0, 0
    end
    local k, e = math.floor(t / W), t % W
    local curr, prev = 0, 0
    if i and i >= k then
      curr, prev = c, p
    elseif i and i + 1 == k then
      prev = c
    end
    if not sliding then prev = 0 end
    return curr, prev, e
  end

  local banned = ban ~= nil and now < ban
  if si and forget_at(si, sc, sp) <= now then si, sc, sp = nil, 0, 0 end

  local curr, prev, e = view(si, sc, sp, now)
  -- The counts after adding n at now (Params::counts).
  local function counts(n)
    if first_hit then
      local start = now
      if si and now < si + W then start = si end
      return start, curr + n, 0
    end
    local k = math.floor(now / W)
    if si and si > k then k = si end
    return k, curr + n, prev
  end

  local granted, new_ban
  local write = false
  local ai, ac, ap = nil, 0, 0
  if op == 'r' or op == 'd' then
    local fit = nil
    if not banned then
      local est = curr + math.floor(prev * (W - e) / W)
      local room = 0
      if est < LIMIT then room = LIMIT - est end
      local n = math.min(copies, room)
      if n >= min then fit = n end
    end
    if fit then
      ai, ac, ap = counts(fit)
      if op == 'r' then write = true end
      granted = fit
    else
      if not banned and ban_ms > 0 then new_ban = now + ban_ms end
      if new_ban and op == 'r' then write = true; ban = new_ban end
      granted, ai, ac, ap = 0, si, sc, sp
    end
  else
    -- A charge.
    if copies > MAX_KEPT - math.min(curr, MAX_KEPT) then
      local state = 'w:'
      if ri then
        state = state .. string.format('%d', ri) .. ',' .. string.format('%d', rc) .. ','
          .. string.format('%d', rp)
      end
      if rban then state = state .. ';' .. string.format('%d', rban) end
      return { 'refused', state, now }
    end
    ai, ac, ap = counts(copies)
    write = true
    granted, min = copies, 1
  end

  -- meter::context
  local ban_until = new_ban
  if not ban_until and banned then ban_until = ban end
  local acurr, aprev, ae = view(ai, ac, ap, now)
  local est = acurr + math.floor(aprev * (W - ae) / W)
  local remaining = 0
  if est < LIMIT then remaining = LIMIT - est end

  -- Params::retry_after at t (nil is never).
  local retry = nil
  if min <= LIMIT then
    local t, extra = now, 0
    if ban_until and now < ban_until then t, extra = ban_until, ban_until - now end
    local c, p, te = view(ai, ac, ap, t)
    if first_hit then
      if c + min <= LIMIT or not ai then retry = 0 else retry = math.max(ai + W - t, 0) end
    else
      local to_next = W - te
      if not sliding then
        if c + min <= LIMIT then retry = 0 else retry = to_next end
      else
        if c + min <= LIMIT then
          local r = LIMIT - min - c
          if p == 0 then
            retry = 0
          else
            local s_most = math.floor(((r + 1) * W - 1) / p)
            if s_most >= to_next then
              retry = 0
            elseif s_most >= 1 then
              retry = to_next - s_most
            end
          end
        end
        if not retry then
          if c == 0 then
            retry = to_next
          else
            local s_most = math.floor(((LIMIT - min + 1) * W - 1) / c)
            retry = to_next + (W - math.min(s_most, W))
          end
        end
      end
    end
    retry = retry + extra
  end

  -- Params::reset_after: until the estimate stays 0.
  local reset = 0
  if ai then
    if not sliding then
      reset = math.max(forget_at(ai, ac, ap) - now, 0)
    else
      local start = now - ae
      local weighing, from = nil, nil
      if acurr > 0 then
        weighing, from = acurr, start + W
      elseif aprev > 0 then
        weighing, from = aprev, start
      end
      if weighing then reset = math.max(from + W - math.floor((W - 1) / weighing) - now, 0) end
    end
  end

  local warning = 0
  if soft > 0 then
    local r = LIMIT % 100
    local threshold = soft * math.floor(LIMIT / 100) + math.floor(soft * r / 100)
    if (soft * r) % 100 ~= 0 then threshold = threshold + 1 end
    if LIMIT - math.min(remaining, LIMIT) >= threshold then warning = 1 end
  end
  local banned_flag = 0
  if ban_until then banned_flag = 1 end
  -- Numbers travel as integer replies (exact below 2^53; Rust reads both).
  local reply = { granted, LIMIT, remaining, reset, retry or -1, warning, banned_flag, -1 }
  if not write then return reply, nil, 0 end

  -- State::pruned, then the value with its forget time, or none.
  local forget = 0
  if ai then
    forget = forget_at(ai, ac, ap)
    if forget <= now then ai, forget = nil, 0 end
  end
  if ban and ban <= now then ban = nil end
  if ban and ban > forget then forget = ban end
  if forget <= now then return reply, false, 0 end
  local value = 'w:'
  if ai then
    value = value .. string.format('%d', ai) .. ',' .. string.format('%d', ac) .. ','
      .. string.format('%d', ap)
  end
  if ban then value = value .. ';' .. string.format('%d', ban) end
  if slack > 0 then value = value .. '@' .. string.format('%d', forget) end
  return reply, value, forget
end
