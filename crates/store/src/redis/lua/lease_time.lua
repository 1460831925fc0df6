-- lease_time(): Redis TIME in ms, on the node that holds KEYS[1] (a Redis
-- Cluster routes a plain TIME to any node; a lease decision decides on the
-- clock of the node that holds its set, as lease_get does).
-- KEYS: 1 the resource's lease set. Reply: the time in ms.
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
