-- lease_put(): stores a lease set decided on the version lease_get read,
-- unless another server stored one since (compare and set: every lease
-- decision is atomic across servers, none is lost). An empty body deletes
-- the set.
-- KEYS: 1 the resource's lease set
-- ARGV: 1 the version read, 2 the new body, 3 clock ('' = Redis TIME),
--       4 when the last lease lapses (decision clock, ms), 5 expiry slack
-- Reply: { 1 } stored, { 0 } changed in between (decide again)
local raw = redis.call('GET', KEYS[1])
local version = 0
if raw then
  local nl = string.find(raw, '\n', 1, true)
  version = tonumber(string.sub(raw, 1, (nl or 1) - 1)) or -1
end
if version ~= tonumber(ARGV[1]) then return { 0 } end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  return { 1 }
end
redis.call('SET', KEYS[1], (version + 1) .. '\n' .. ARGV[2])
local now, redis_now = clock(ARGV[3])
expire_at(KEYS[1], tonumber(ARGV[4]), now, redis_now, tonumber(ARGV[5]))
return { 1 }
