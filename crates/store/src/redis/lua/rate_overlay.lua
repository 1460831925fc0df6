-- The overlay of meters.lua's burst tiers: the Redis commands rate_step
-- runs (through rcall), answered as if they had been run, but written
-- only by ov_flush, once every operation of the batch is decided and
-- none was rejected. An all-or-nothing batch cannot write as it goes: a
-- Lua script's writes are not undone when a later decision rejects. The
-- tiers' rule keeps running unchanged on it (rate_step.lua), and the
-- second operation of a batch on one pair reads what the first left.
--
-- A key's entry is a string (GET, SET, DEL) or a list (LPOP, LINDEX 0,
-- LSET -1, RPUSH, LRANGE, DEL) seen as what Redis holds, from `off` on,
-- with its last element replaced by `last` (an LSET on it), followed by
-- `tail` (pushed here). Nothing is copied from Redis but what the rule
-- reads, so a batch costs what its operations cost in rate.lua. An
-- expiry (SET's PXAT, PEXPIREAT, PERSIST) is the last one set since the
-- key last stopped existing, as in Redis.

local ov = {}
local ov_order = {}

local function ov_entry(key)
  local e = ov[key]
  if not e then
    e = { key = key }
    ov[key] = e
    ov_order[#ov_order + 1] = key
  end
  return e
end

-- The key no longer exists (DEL, or its list emptied): empty as a string
-- and as a list, and deleted first when flushed.
local function ov_gone(e)
  e.reset, e.ttl = true, nil
  e.val, e.wrote = false, true
  e.base, e.off, e.last, e.tail = 0, 0, nil, {}
end

local function ov_list(e)
  if not e.list then
    e.list = true
    if not e.reset then
      e.base = redis.call('LLEN', e.key)
      e.off, e.last, e.tail = 0, nil, {}
    end
  end
  return e
end

local function ov_len(e)
  return e.base - e.off + #e.tail
end

-- The element at index `i` (from 0) of what Redis holds.
local function ov_base_at(e, i)
  if i == e.base - 1 and e.last then return e.last end
  return redis.call('LINDEX', e.key, i)
end

local function ov_exists(e)
  if e.list then return ov_len(e) > 0 end
  if e.str or e.reset then return e.val ~= nil and e.val ~= false end
  return redis.call('EXISTS', e.key) == 1
end

local function ov_call(cmd, key, a, b, c)
  if cmd == 'DEL' then
    -- (rate_step deletes one or two keys at a time)
    ov_gone(ov_entry(key))
    if a then ov_gone(ov_entry(a)) end
    return
  end
  local e = ov_entry(key)
  if cmd == 'GET' then
    if not e.str then
      e.str = true
      if not e.reset then e.val = redis.call('GET', key) end
    end
    return e.val
  elseif cmd == 'SET' then
    -- SET key value [PXAT at]: without PXAT the key keeps no expiry.
    e.str, e.val, e.wrote = true, a, true
    if b == 'PXAT' then e.ttl = { 'PEXPIREAT', c } else e.ttl = { 'PERSIST' } end
    return
  elseif cmd == 'PEXPIREAT' or cmd == 'PERSIST' then
    -- (on a key that does not exist, nothing, as in Redis)
    if ov_exists(e) then e.ttl = { cmd, a } end
    return
  end
  ov_list(e)
  if cmd == 'LPOP' then
    local v
    if e.off < e.base then
      v = ov_base_at(e, e.off)
      e.off = e.off + 1
    else
      v = table.remove(e.tail, 1)
    end
    if ov_len(e) == 0 then ov_gone(e) end
    return v or false
  elseif cmd == 'LINDEX' then
    -- (rate_log.lua reads the head only)
    if a ~= 0 then error('CHARON overlay: LINDEX ' .. tostring(a)) end
    if e.off < e.base then return ov_base_at(e, e.off) end
    return e.tail[1] or false
  elseif cmd == 'LSET' then
    -- (rate_log.lua sets the last element only)
    if a ~= -1 then error('CHARON overlay: LSET ' .. tostring(a)) end
    if #e.tail > 0 then
      e.tail[#e.tail] = b
    elseif e.off < e.base then
      e.last = b
    else
      error({ err = 'ERR no such key' })
    end
    return
  elseif cmd == 'RPUSH' then
    e.tail[#e.tail + 1] = a
    return ov_len(e)
  elseif cmd == 'LRANGE' then
    -- LRANGE key from to, with 0 <= from <= to (rate_context.lua)
    local out = {}
    local n_base = e.base - e.off
    if a < n_base then
      local upto = math.min(b, n_base - 1)
      local raws = redis.call('LRANGE', key, e.off + a, e.off + upto)
      for k, raw in ipairs(raws) do
        if e.last and e.off + a + k - 1 == e.base - 1 then raw = e.last end
        out[#out + 1] = raw
      end
    end
    for k = math.max(a, n_base), b do
      local raw = e.tail[k - n_base + 1]
      if not raw then break end
      out[#out + 1] = raw
    end
    return out
  end
  error('CHARON overlay: ' .. cmd)
end

-- Writes what the overlay holds: each key as the batch left it.
local function ov_flush()
  for _, key in ipairs(ov_order) do
    local e = ov[key]
    if e.reset then redis.call('DEL', key) end
    if e.list then
      -- The last element first, by its index (before anything moves it),
      -- then the new ones, then the old ones dropped from the front: the
      -- list never empties on the way, so it keeps its expiry, as it does
      -- when the commands are run one by one.
      if e.last and e.off < e.base then redis.call('LSET', key, e.base - 1, e.last) end
      for _, raw in ipairs(e.tail) do redis.call('RPUSH', key, raw) end
      if e.off > 0 then redis.call('LTRIM', key, e.off, -1) end
    elseif e.str and e.wrote and e.val then
      redis.call('SET', key, e.val)
    end
    if e.ttl and e.ttl[1] == 'PERSIST' then
      redis.call('PERSIST', key)
    elseif e.ttl then
      redis.call('PEXPIREAT', key, e.ttl[2])
    end
  end
end
