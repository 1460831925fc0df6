-- meters(ops): an all-or-nothing batch of bucket, window, queue and burst
-- tiers operations (Store::meters; Envoy's descriptors, SPEC §11), in one
-- round trip. Every operation is decided in order on the states as the
-- earlier ones left them (held here, not in Redis: the meters' states in
-- `states`, the tiers' keys in the overlay of rate_overlay.lua); the
-- states are written only if no request among them was rejected
-- (charon_core::meter::Op::rejects, repeated below), shadowed operations
-- (Envoy's shadow mode) aside. Otherwise nothing is written at all, not
-- even a ban, nor what time alone made irrelevant.
--
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2]  expiry slack (ms)
-- Then each operation in turn, from ARGV[a] (a = 3 for the first), its
-- keys from KEYS[k] (k = 1 for the first):
--   ARGV[a]  '1' shadowed (its rejection does not stop the batch), '0' not
--   a bucket, window or queue: ARGV[a + 1 ..] its 10 arguments (see
--     meter_op.lua, whose first is its kind 'b', 'q' or 'w'); KEYS[k]
--     its state (a key may repeat)
--   burst tiers: ARGV[a + 1] = 't', then rate.lua's ARGV[3 ..] (from
--     DORMANT_GRACE to the tiers' five values each); KEYS[k ..] rate.lua's
--     4 + n keys
--
-- Reply: {committed (1 or 0), then per operation 8 values as drain.lua or window.lua
--        returns them, or 13 as rate.lua does}, or
--        {'refused', i (from 0), state, now}: operation i is a charge
--        whose debt would not be kept exactly, or
--        {'over', i, 'd' | 'g' | 't', count, granted}: operation i (tiers)
--        would take a count past MAX_COUNT (see rate.lua);
--        nothing changed, and the Rust side asks core for the error.

local now, redis_now = clock(ARGV[1])
local slack = tonumber(ARGV[2])
rcall = ov_call
local states = {}
local last = {}
local order = {}
local out = { 1 }
local a, k, i = 3, 1, 0
while a <= #ARGV do
  i = i + 1
  local shadow = ARGV[a] == '1'
  local reply, rejected
  if ARGV[a + 1] == 't' then
    local n = tonumber(ARGV[a + 8])
    -- rate_step's ARGV[ab + 3] is ARGV[a + 2]; its KEYS[kb + 1] is KEYS[k]
    reply = rate_step(k - 1, a - 1, now, redis_now, slack)
    if reply[1] == 'over' then
      return { 'over', fmt(i - 1), reply[2], reply[3], reply[4] }
    end
    local op = ARGV[a + 11]
    rejected = (op == 'r' or op == 'd') and reply[1] == '0'
    a = a + 14 + 5 * n
    k = k + 4 + n
  else
    local key = KEYS[k]
    local m = meter_args(a + 1)
    local st = states[key]
    if not st then
      st = meter_read(m, redis.call('GET', key), now)
      states[key] = st
    end
    local write
    reply, write = meter_decide(m, st, now)
    if not reply then
      return { 'refused', fmt(i - 1), meter_encode(m, st), fmt(now) }
    end
    if write then
      states[key] = write
      if not last[key] then order[#order + 1] = key end
      last[key] = { m = m, write = write }
    end
    rejected = (m.op == 'r' or m.op == 'd') and reply[1] == '0'
    a = a + 11
    k = k + 1
  end
  -- Op::rejects: a request (or dry run) granted nothing.
  if not shadow and rejected then out[1] = 0 end
  for j = 1, #reply do out[#out + 1] = reply[j] end
end
if out[1] == 1 then
  ov_flush()
  for _, key in ipairs(order) do
    meter_store(key, last[key].m, last[key].write, now, redis_now, slack)
  end
end
return out
