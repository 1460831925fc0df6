-- Makes a copy operation whose reply was lost as if it had never run:
-- the client was told it failed. See the operation records in copy.lua.
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp,
--       5 the operation's record
-- ARGV: 1 test clock, 2 record ttl
-- A reserve that joined the queue ('join') leaves it, and gives back what
-- it was handed meanwhile; copies freed serve the queue.
-- Reply: {'cancelled'} (it had not run and now never will), {'undone', kind},
--        {'fenced'}
local now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
local raw = redis.call('GET', KEYS[5])
if not raw then
  remember(KEYS[5], ARGV[2], { 'cancelled' })
  return { 'cancelled' }
end
local r = cmsgpack.unpack(raw)
local kind = r[1]
if kind == 'cancelled' or kind == 'undone' then return { kind } end
wait_keys(KEYS[1])
pass_time(now, KEYS[3], KEYS[4])
local n, fs = r[2], fields(r[3], r[4])
if kind == 'join' then
  -- A reserve that joined the queue: out of it; copies handed to it since
  -- are given back.
  local ticket = r[5]
  if redis.call('ZREM', W.q, ticket) == 1 then drop_waiter(ticket) end
  local a = take(ticket)
  n = 0
  if a then n = a[1] end
end
if kind == 'reserve' or kind == 'join' then
  if n > 0 then
    sub(KEYS[1], fs, n)
    sub(KEYS[2], fs, n)
  end
  if waiting() then walk(now) end
elseif kind == 'release' then
  -- The session still holds them.
  add(KEYS[1], fs, n)
  add(KEYS[2], fs, n)
elseif kind == 'transfer' then
  if redis.call('HEXISTS', KEYS[3], r[5]) == 1 then
    redis.call('HDEL', KEYS[3], r[5])
    redis.call('ZREM', KEYS[4], r[5])
  else
    -- Seized or expired meanwhile: the session still holds them, so they
    -- count again (too many rather than too few until it releases them).
    add(KEYS[1], fs, n)
  end
  add(KEYS[2], fs, n)
elseif kind == 'seize' then
  sub(KEYS[2], fs, n)
  if r[6] > now then
    redis.call('HSET', KEYS[3], r[5], cmsgpack.pack({ r[6], n, r[3], r[4] }))
    redis.call('ZADD', KEYS[4], fmt(r[6]), r[5])
  else
    sub(KEYS[1], fs, n)
  end
end
remember(KEYS[5], ARGV[2], { 'undone' })
return { 'undone', kind }
