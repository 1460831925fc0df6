-- A server joins the membership (at start).
-- KEYS: 1 registry (set of member ids), 2 generation, 3 start lock,
--       4 this member's liveness, 5 rebuild, 6 activity tick,
--       7.. liveness of each registered member as the caller read the
--       registry just before
-- ARGV: 1 this member's id, 2 liveness ttl (ms), 3 a new generation id
--       (used if Redis has none), 4 rebuild grace (ms), 5 the liveness
--       keys' prefix, 6.. the member ids of KEYS[7..]
-- Reply: {outcome, generation, gate}; outcome is
--   'wait'   another server is cleaning up after starting alone
--   'retry'  the registry changed since the caller read it
--   'alone'  registered, and no other member is live: this server holds
--            the start lock and must clean up before serving
--   'joined' registered among live members
-- A generation created here opens a rebuild window like any other: this
-- server cannot tell a Redis used for the first time from one that lost
-- its data while servers holding copies have not noticed yet.
local _, now = clock('')
idle_for(KEYS[6], now)
local gen = redis.call('GET', KEYS[2])
if not gen then
  gen = ARGV[3]
  redis.call('SET', KEYS[2], gen)
  open_window(KEYS[5], now, tonumber(ARGV[4]))
end
local lock = redis.call('GET', KEYS[3])
if lock and lock ~= ARGV[1] then return { 'wait', gen, 'closed' } end
local declared = {}
for i = 6, #ARGV do declared[ARGV[i]] = KEYS[i + 1] end
local others = 0
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if m ~= ARGV[1] then
    local k = declared[m]
    if not k then return { 'retry', gen, 'closed' } end
    if redis.call('EXISTS', k) == 1 then others = others + 1 end
  end
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SET', KEYS[4], ARGV[2], 'PX', ARGV[2])
local g = gate(KEYS[5], ARGV[5], now)
if others == 0 then
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
  return { 'alone', gen, g }
end
return { 'joined', gen, g }
