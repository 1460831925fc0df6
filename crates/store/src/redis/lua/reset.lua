-- Run by a server that starts alone (no other server is live): nobody
-- holds copies of this resource any more, so its counts become what is
-- still staged (transfers outlive servers until their ttl), and every
-- contribution left behind is replaced by the dead-server mark. Its
-- waiters and their answers were dead servers' too: dropped.
-- KEYS: 1 counts, 2 staging, 3 staging exp, 4.. contributions found
-- ARGV: 1 test clock, 2 how long the marks stay (ms)
-- Reply: {global count before, global count after}
local now = clock(ARGV[1])
local before = tonumber(redis.call('HGET', KEYS[1], 'g')) or 0
expire_staged(KEYS[1], KEYS[2], KEYS[3], now)
for i = 4, #KEYS do
  if not fenced(KEYS[i]) then
    redis.call('DEL', KEYS[i])
    redis.call('HSET', KEYS[i], '!', '1')
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  end
end
redis.call('DEL', KEYS[1])
wait_keys(KEYS[1])
redis.call('DEL', W.q, W.w, W.d, W.r)
local staged = redis.call('HGETALL', KEYS[2])
for i = 2, #staged, 2 do
  local e = cmsgpack.unpack(staged[i])
  add(KEYS[1], fields(e[3], e[4]), e[2])
end
return { before, tonumber(redis.call('HGET', KEYS[1], 'g')) or 0 }
