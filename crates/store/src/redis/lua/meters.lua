-- meters(ops): an all-or-nothing batch of bucket, window and queue
-- operations (Store::meters; Envoy's descriptors, SPEC §11), in one round
-- trip. Every operation is decided in order on the states as the earlier
-- ones left them (held here, not in Redis); the states are written only
-- if no request among them was rejected (charon_core::meter::Op::rejects,
-- repeated below), shadowed operations (Envoy's shadow mode) aside.
-- Otherwise nothing is written at all, not even a ban.
--
-- KEYS[i]  the state of operation i (a key may repeat)
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2]  expiry slack (ms)
-- ARGV[3 + 11(i-1)]  operation i: '1' shadowed (its rejection does not
--                     stop the batch), '0' not
-- ARGV[4 + 11(i-1) ..]  operation i (see meter_op.lua)
--
-- Reply: {committed (1 or 0), then 8 values per operation as meter.lua
--        returns them}, or {'refused', i (from 0), state, now}: operation
--        i is a charge whose debt would not be kept exactly; nothing
--        changed, and the Rust side asks core for the error.

local now, redis_now = clock(ARGV[1])
local slack = tonumber(ARGV[2])
local states = {}
local last = {}
local order = {}
local out = { 1 }
for i = 1, #KEYS do
  local key = KEYS[i]
  local at = 3 + 11 * (i - 1)
  local shadow = ARGV[at] == '1'
  local m = meter_args(at + 1)
  local st = states[key]
  if not st then
    st = meter_read(m, redis.call('GET', key), now)
    states[key] = st
  end
  local reply, write = meter_decide(m, st, now)
  if not reply then
    return { 'refused', fmt(i - 1), meter_encode(m, st), fmt(now) }
  end
  if write then
    states[key] = write
    if not last[key] then order[#order + 1] = key end
    last[key] = { m = m, write = write }
  end
  -- Op::rejects: a request (or dry run) granted nothing.
  if not shadow and (m.op == 'r' or m.op == 'd') and reply[1] == '0' then
    out[1] = 0
  end
  for j = 1, 8 do out[#out + 1] = reply[j] end
end
if out[1] == 1 then
  for _, key in ipairs(order) do
    meter_store(key, last[key].m, last[key].write, now, redis_now, slack)
  end
end
return out
