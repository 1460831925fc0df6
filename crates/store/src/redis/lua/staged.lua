-- staged(): copies waiting in one resource's staging area (for metrics).
-- KEYS: 1 staging
-- Reply: the number of copies staged
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  total = total + cmsgpack.unpack(v)[2]
end
return { total }
