-- The clock, the read and the write of the lean meter scripts (drain.lua,
-- window.lua, meter_batch.lua, meters_lean.lua), before lean_drain.lua and
-- lean_window.lua.

-- The level text and the ban end (a number, or nil) of a stored lean value
-- '<kind>:<level>', with ';<ban end>' when a ban is kept and, under a test
-- clock only, '@<forget time>' after them (the value is no state from then
-- on, as the key would be gone with Redis TIME). nil, nil when `raw` holds
-- no state of `kind` at `now`.
local function lean_value(raw, kind, now)
  if not raw then return nil, nil end
  local k, rest = string.match(raw, '^(%a):(.*)$')
  if rest and string.find(rest, '@', 1, true) then
    local body, written_forget = string.match(rest, '^(.*)@(%d+)$')
    if body then
      rest = body
      if now >= tonumber(written_forget) then k = nil end
    end
  end
  if k ~= kind then return nil, nil end
  local lv, b = string.match(rest, '^([^;]*);(%d+)$')
  if not lv then lv = rest end
  return lv, b and tonumber(b)
end

-- (now, redis_now) as common.lua's clock: Redis TIME in milliseconds, or
-- the test clock's time when one is given.
local function lean_clock(arg)
  local t = redis.call('TIME')
  local redis_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if arg == '' then return redis_now, redis_now end
  return tonumber(arg), redis_now
end

-- Stores what an op returned: nothing (nil), DEL (false), or SET with the
-- expiry at its forget time on Redis' clock (plus the test clock's slack).
local function lean_store(key, value, forget, now, redis_now, slack)
  if value == nil then return end
  if value == false then
    redis.call('DEL', key)
  else
    redis.call('SET', key, value, 'PXAT', string.format('%d', forget - now + redis_now + slack))
  end
end
