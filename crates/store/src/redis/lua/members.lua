-- Shared by the membership scripts (after common.lua). All their keys are
-- in the membership slot ({%m}).
--
-- The copy gate. When a new generation of the copy log starts (Redis lost
-- its data, or this is its first use), the counts must be rebuilt from the
-- hold sets of every live server before anyone reserves again. The
-- rebuild hash says who is still at it:
--   until       Redis time (ms) before which the gate stays closed anyway,
--               so that servers that have not noticed the new generation
--               yet (they renew every third of the ttl) can join it
--   r:<member>  a server rebuilding its holds
-- The gate is open when the hash is gone. A rebuilding server whose
-- liveness lapsed is dropped from it: its sessions died with it.

-- 'open' or 'closed', dropping what no longer keeps the gate closed.
local function gate(rebuild, live_prefix, now)
  if redis.call('EXISTS', rebuild) == 0 then return 'open' end
  local h = redis.call('HGETALL', rebuild)
  local until_ms, pending = 0, 0
  for i = 1, #h, 2 do
    local f = h[i]
    if f == 'until' then
      until_ms = tonumber(h[i + 1])
    elseif string.sub(f, 1, 2) == 'r:' then
      if redis.call('EXISTS', live_prefix .. string.sub(f, 3)) == 1 then
        pending = pending + 1
      else
        redis.call('HDEL', rebuild, f)
      end
    end
  end
  if pending == 0 and now >= until_ms then
    redis.call('DEL', rebuild)
    return 'open'
  end
  return 'closed'
end

-- Starts the rebuild window of a new generation (no window if grace is 0).
local function open_window(rebuild, now, grace)
  if grace > 0 then
    redis.call('HSET', rebuild, 'until', fmt(now + grace))
  end
end

-- How long (ms) no membership script ran before this one, and records
-- this run. A long gap means Redis was stalled (or every server was
-- down): liveness keys that lapsed meanwhile say nothing about the
-- servers, only about Redis.
local function idle_for(tick, now)
  local last = tonumber(redis.call('GET', tick)) or now
  redis.call('SET', tick, fmt(now))
  return math.max(now - last, 0)
end
