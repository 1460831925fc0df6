-- The copy gate (see members.lua), after removing a member that finished
-- rebuilding its holds (ARGV[2], or '' for none).
-- KEYS: 1 rebuild, 2 activity tick
-- ARGV: 1 the liveness keys' prefix, 2 member id or ''
-- Reply: {'open'} or {'closed'}
local _, now = clock('')
idle_for(KEYS[2], now)
if ARGV[2] ~= '' then redis.call('HDEL', KEYS[1], 'r:' .. ARGV[2]) end
return { gate(KEYS[1], ARGV[1], now) }
