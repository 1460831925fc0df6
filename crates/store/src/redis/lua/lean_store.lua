-- The clock and the write of the lean meter scripts (drain.lua,
-- window.lua, meter_batch.lua), after lean_drain.lua and lean_window.lua.

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
