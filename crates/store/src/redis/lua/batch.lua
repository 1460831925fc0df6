-- batch(ops): independent burst tiers operations that arrived together for
-- one hash slot (the batcher of batch.rs; meters go to meter_batch.lua),
-- decided one after another in arrival order in one script call. Each is
-- decided exactly as rate.lua would decide it alone at that moment (the
-- same function, rate_step), and writes straight to Redis, so each sees
-- what the earlier ones wrote. One operation's outcome, rejection or error
-- never stops another: an error (a key of another type, say) is caught and
-- answered for that operation alone. All operations of a batch are decided
-- at one clock reading.
--
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2]  expiry slack (ms)
-- Then each operation in turn, from ARGV[a] (a = 3 for the first), its
-- keys from KEYS[k] (k = 1 for the first): rate.lua's ARGV[3 ..] (from
-- DORMANT_GRACE to the tiers' five values each); KEYS[k ..] rate.lua's
-- 4 + n keys
--
-- Reply: per operation, the reply rate.lua would give (its 'over' form
--        included), or {'error', message}.

local now, redis_now = clock(ARGV[1])
local slack = tonumber(ARGV[2])
local out = {}
local a, k = 3, 1
while a <= #ARGV do
  local n = tonumber(ARGV[a + 6])
  -- rate_step's ARGV[ab + 3] is ARGV[a]; its KEYS[kb + 1] is KEYS[k]
  local ok, reply = pcall(rate_step, k - 1, a - 3, now, redis_now, slack)
  a = a + 12 + 5 * n
  k = k + 4 + n
  if not ok then
    if type(reply) == 'table' then reply = reply.err end
    reply = { 'error', tostring(reply) }
  end
  out[#out + 1] = reply
end
return out
