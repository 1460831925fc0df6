-- meter(resource, domain, op): one decision of a bucket, window or queue
-- (see meter_op.lua, which decides).
--
-- KEYS[1]  the pair's state
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2]  expiry slack (ms)
-- ARGV[3..12]  the operation (see meter_op.lua)
--
-- Client errors that do not depend on the state (a charge of 0, a refund
-- on a window) are refused by the Rust side before the call.
--
-- Reply: {granted, limit, remaining, reset_after_ms, retry_after_ms
--         (-1 = never), warning, banned, delay_ms (-1 = none)}, or
--        {'refused', state, now}: a charge whose debt would not be kept
--        exactly; nothing changed, and the Rust side asks core for the
--        error on the same state at the same time.

local now, redis_now = clock(ARGV[1])
return meter_one(KEYS[1], 3, now, redis_now, tonumber(ARGV[2]))
