-- Refreshes (ARGV[2] > 0, for that many ms) or releases (ARGV[2] = 0) the
-- start lock, only if this member (ARGV[1]) holds it.
-- KEYS: 1 start lock
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
end
return 1
