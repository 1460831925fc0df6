-- meter_batch(ops): bucket, window and queue operations that arrived
-- together for one hash slot (the batcher of batch.rs, when a batch holds
-- no burst tiers), decided one after another in arrival order at one clock
-- reading, each exactly as drain.lua or window.lua would decide it alone
-- at that moment. Each key is read once (its first operation) and written
-- once (after the last), whatever the number of operations on it: the
-- later operations decide on what the earlier ones left, held here. An
-- operation's error (a key of another type, bad data) is answered for it
-- alone, as batch.lua does.
--
-- ARGV[1]  test clock ('' = Redis TIME)      ARGV[2]  expiry slack (ms)
-- Then each operation's 10 arguments (drain.lua's ARGV[3 ..]), KEYS[i]
-- the state of the i-th operation.
-- Reply: per operation, drain.lua's reply, or {'error', message}.

local now, redis_now = lean_clock(ARGV[1])
local slack = tonumber(ARGV[2])
-- Per key: its value as the operations so far left it (false: none), and
-- what to store at the end (nil: unchanged) with its forget time.
local held, pending, forgets, order = {}, {}, {}, {}
local out = {}
local a = 3
for i = 1, #KEYS do
  local key = KEYS[i]
  local raw = held[key]
  local ok, reply, value, forget = true, nil, nil, 0
  if raw == nil then
    ok, raw = pcall(redis.call, 'GET', key)
    if ok then held[key] = raw end
  end
  if ok then
    if ARGV[a] == 'w' then
      ok, reply, value, forget = pcall(window_op, raw, a, now, slack)
    else
      ok, reply, value, forget = pcall(drain_op, raw, a, now, slack)
    end
  else
    reply = raw
  end
  if not ok then
    if type(reply) == 'table' then reply = reply.err end
    reply = { 'error', tostring(reply) }
  elseif value ~= nil then
    if pending[key] == nil then order[#order + 1] = key end
    held[key], pending[key], forgets[key] = value, value, forget
  end
  out[i] = reply
  a = a + 10
end
for _, key in ipairs(order) do
  lean_store(key, pending[key], forgets[key], now, redis_now, slack)
end
return out
