-- Releases the expired staged transfers of one resource (maintenance).
-- KEYS: 1 counts, 2 staging, 3 staging exp
-- ARGV: 1 test clock
-- Reply: {expired, staged transfers left}
local now = clock(ARGV[1])
local expired = expire_staged(KEYS[1], KEYS[2], KEYS[3], now)
return { expired, redis.call('ZCARD', KEYS[3]) }
