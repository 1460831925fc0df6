-- One window operation: GET, the decision of lean_window.lua, then at
-- most one SET ... PXAT or DEL. Keys, arguments and reply as drain.lua's
-- (kind 'w'; delay_ms is always -1).
local now, redis_now = lean_clock(ARGV[1])
local slack = tonumber(ARGV[2])
local reply, value, forget = window_op(redis.call('GET', KEYS[1]), 3, now, slack)
lean_store(KEYS[1], value, forget, now, redis_now, slack)
return reply
