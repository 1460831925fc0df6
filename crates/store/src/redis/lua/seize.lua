-- seize(transfer_id): staged copies join this server's contribution.
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp,
--       5 this operation's record
-- ARGV: 1 test clock, 2 record ttl, 3 transfer id
-- Reply: {'ok', copies, domain, groups...}, {'none'}, {'fenced'} or {'cancelled'}
local now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
if cancelled(KEYS[5]) then return { 'cancelled' } end
wait_keys(KEYS[1])
pass_time(now, KEYS[3], KEYS[4])

local raw = redis.call('HGET', KEYS[3], ARGV[3])
if not raw then return { 'none' } end
redis.call('HDEL', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
local e = cmsgpack.unpack(raw)
add(KEYS[2], fields(e[3], e[4]), e[2])
remember(KEYS[5], ARGV[2], { 'seize', e[2], e[3], e[4], ARGV[3], e[1] })
local reply = { 'ok', e[2], e[3] }
for _, g in ipairs(e[4]) do reply[#reply + 1] = g end
return reply
