-- Removes a dead server's contribution to one resource's counts, and
-- leaves a mark ('!') in its place for `ARGV[1]` ms so that the dead
-- server, should it still be running, cannot change these counts again.
-- Idempotent: a second run (by another survivor) finds only the mark.
-- KEYS: 1 counts, 2 the dead server's contribution
-- Its waiters leave the queue and its answers not taken are dropped (their
-- copies were part of its contribution), then the queue is served.
-- ARGV: 1 how long the mark stays (ms), 2 test clock
-- Reply: {copies removed from the global count, fields that would have
--        gone negative, waiters that left}
local kv = redis.call('HGETALL', KEYS[2])
local removed, negative = 0, 0
for i = 1, #kv, 2 do
  local f = kv[i]
  if f ~= '!' then
    local v = tonumber(kv[i + 1])
    negative = negative + sub(KEYS[1], { f }, v)
    if f == 'g' then removed = v end
  end
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], '!', '1')
redis.call('PEXPIRE', KEYS[2], ARGV[1])
wait_keys(KEYS[1])
local gone = 0
if waiting() or redis.call('EXISTS', W.r) == 1 then
  gone = drop_member(member_of(KEYS[2]), clock(ARGV[2]))
end
return { removed, negative, gone }
