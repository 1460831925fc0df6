-- One bucket or queue operation: GET, the decision of lean_drain.lua,
-- then at most one SET ... PXAT or DEL.
--
-- KEYS[1]  the pair's state
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2]  expiry slack (ms)
-- ARGV[3..12]  the operation (see meter_op.lua): kind, 4 parameters, soft
--          limit percent, ban, op, copies, min_copies
--
-- Client errors that do not depend on the state (a charge of 0, a refund
-- on a queue) are refused by the Rust side before the call.
--
-- Reply: {granted, limit, remaining, reset_after_ms, retry_after_ms
--         (-1 = never), warning, banned, delay_ms (-1 = none)}, or
--        {'refused', state, now}: a charge whose debt would not be kept
--        exactly; nothing changed, and the Rust side asks core for the
--        error on the same state at the same time.
local now, redis_now = lean_clock(ARGV[1])
local slack = tonumber(ARGV[2])
local reply, value, forget = drain_op(redis.call('GET', KEYS[1]), 3, now, slack)
lean_store(KEYS[1], value, forget, now, redis_now, slack)
return reply
