-- Renews this member's liveness.
-- KEYS: 1 this member's liveness, 2 generation, 3 registry, 4 rebuild,
--       5 start lock, 6 this member's suspicion, 7 activity tick
-- ARGV: 1 the generation this member joined, 2 ttl (ms), 3 member id,
--       4 a new generation id (used if Redis has none), 5 rebuild grace
--       (ms), 6 the liveness keys' prefix
-- Reply: {outcome, generation, gate ('open' or 'closed')}; outcome is
--   'ok'      renewed
--   'revived' the liveness key had lapsed (Redis stalled or was out of
--             reach for longer than the ttl) but nobody fenced this
--             member: nothing of its contributions was touched, renewed
--   'fenced'  another member fenced this one (see fence.lua) and removes
--             or removed its contributions: it must resign
--   'new'     the generation changed (Redis lost its data): this member
--             registered in the new one and must rebuild its holds
--             before it touches copies again (see rebuild.lua)
--   'late'    the same, after the new generation's rebuild window had
--             closed: the gate closes again until this member is done
--   'wait'    a server starting alone is cleaning up: try again soon
local _, now = clock('')
idle_for(KEYS[7], now)
local gen = redis.call('GET', KEYS[2])
if gen == ARGV[1] then
  if redis.call('SISMEMBER', KEYS[3], ARGV[3]) == 0 then
    return { 'fenced', gen, 'closed' }
  end
  local existed = redis.call('EXISTS', KEYS[1])
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[2])
  redis.call('DEL', KEYS[6])
  local outcome = 'ok'
  if existed == 0 then outcome = 'revived' end
  return { outcome, gen, gate(KEYS[4], ARGV[6], now) }
end
local lock = redis.call('GET', KEYS[5])
if lock and lock ~= ARGV[3] then return { 'wait', gen or '', 'closed' } end
local outcome = 'new'
if not gen then
  gen = ARGV[4]
  redis.call('SET', KEYS[2], gen)
  open_window(KEYS[4], now, tonumber(ARGV[5]))
elseif redis.call('EXISTS', KEYS[4]) == 0 then
  outcome = 'late'
end
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[2])
redis.call('DEL', KEYS[6])
redis.call('HSET', KEYS[4], 'r:' .. ARGV[3], '1')
if redis.call('HEXISTS', KEYS[4], 'until') == 0 then
  redis.call('HSET', KEYS[4], 'until', fmt(now))
end
return { outcome, gen, 'closed' }
