-- Fences a member whose liveness lapsed, so that its contributions may be
-- removed: it leaves the registry for the dead set, and from then on its
-- renewal answers 'fenced'. Fencing and renewing are atomic steps on the
-- same slot, so exactly one of them wins: a member that renewed is never
-- fenced, a fenced member never renews.
--
-- A lapsed member is first only suspected; it is fenced if it is still
-- lapsed a grace period later (measured by Redis' clock while Redis runs
-- scripts: after a gap longer than `idle` the suspicion starts over, since
-- a Redis that was stalled lets every liveness key lapse at once).
-- KEYS: 1 registry, 2 dead set, 3 the member's liveness, 4 its suspicion,
--       5 activity tick
-- ARGV: 1 member id, 2 grace (ms), 3 '1' to fence at once (a member
--       leaving), 4 idle bound (ms), 5 how long a suspicion is kept (ms)
-- Reply: {outcome}: 'fenced' (now or before), 'live', 'suspect', or
--        'gone' (not a member: forgotten, or never joined)
local _, now = clock('')
local idle = idle_for(KEYS[5], now)
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return { 'fenced' } end
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return { 'gone' } end
if ARGV[3] ~= '1' then
  if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('DEL', KEYS[4])
    return { 'live' }
  end
  local since = tonumber(redis.call('GET', KEYS[4]))
  if not since or idle > tonumber(ARGV[4]) then
    redis.call('SET', KEYS[4], fmt(now), 'PX', ARGV[5])
    return { 'suspect' }
  end
  if now - since < tonumber(ARGV[2]) then return { 'suspect' } end
end
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4])
return { 'fenced' }
