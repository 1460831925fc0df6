-- Releases the expired staged transfers of one resource (maintenance),
-- rejects its waiters past their deadline and serves its queue.
-- KEYS: 1 counts, 2 staging, 3 staging exp
-- ARGV: 1 test clock
-- Reply: {expired, staged transfers left}
local now = clock(ARGV[1])
wait_keys(KEYS[1])
local queued = waiting()
if queued then expire_waiters(now) end
local expired = expire_staged(KEYS[1], KEYS[2], KEYS[3], now)
if expired > 0 and queued then walk(now) end
return { expired, redis.call('ZCARD', KEYS[3]) }
