-- meters_lean(ops): meters.lua for a batch of buckets, windows and queues
-- only (no burst tiers: Envoy's inline limits, say): the same arguments,
-- reply and all-or-nothing rule, decided by lean_drain.lua and
-- lean_window.lua. Each key is read once; the later operations on it
-- decide on what the earlier ones left (held here); the states are
-- written, once per key, only if no request among them was rejected
-- (charon_core::meter::Op::rejects), shadowed operations aside.
--
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2]  expiry slack (ms)
-- Then per operation 11 arguments: '1' shadowed or '0', then its 10 (see
-- meter_op.lua); KEYS[i] the state of the i-th operation (a key may
-- repeat).
-- Reply: as meters.lua's: {committed, then 8 values per operation}, or
--        {'refused', i (from 0), state, now}.

local now, redis_now = lean_clock(ARGV[1])
local slack = tonumber(ARGV[2])
local held, pending, forgets, order = {}, {}, {}, {}
local out = { 1 }
local a = 3
for i = 1, #KEYS do
  local key = KEYS[i]
  local raw = held[key]
  if raw == nil then
    raw = redis.call('GET', key)
    held[key] = raw
  end
  local reply, value, forget
  if ARGV[a + 1] == 'w' then
    reply, value, forget = window_op(raw, a + 1, now, slack)
  else
    reply, value, forget = drain_op(raw, a + 1, now, slack)
  end
  if reply[1] == 'refused' then
    return { 'refused', i - 1, reply[2], reply[3] }
  end
  if value ~= nil then
    if pending[key] == nil then order[#order + 1] = key end
    held[key], pending[key], forgets[key] = value, value, forget
  end
  -- Op::rejects: a request (or dry run) that granted nothing, unless
  -- shadowed.
  local op = ARGV[a + 8]
  if ARGV[a] ~= '1' and (op == 'r' or op == 'd') and reply[1] == 0 then out[1] = 0 end
  for j = 1, 8 do out[#out + 1] = reply[j] end
  a = a + 11
end
if out[1] == 1 then
  for _, key in ipairs(order) do
    lean_store(key, pending[key], forgets[key], now, redis_now, slack)
  end
end
return out
