-- Shared by the copy scripts (after common.lua).
--
-- A copy-limited resource's keys, all in the resource's slot:
--   counts        hash  g -> copies held in all, d:<domain> -> by domain,
--                       G:<group> -> by group
--   contribution  hash  the same fields: one server's part of each count
--                       (field '!' alone marks a dead server: see fenced)
--   staging       hash  transfer id -> msgpack {expires, copies, domain, {groups}}
--   staging exp   zset  transfer id scored by its expiry
-- Invariant: every count = the sum of the contributions + staged copies.

-- The count fields a hold of `domain` under `groups` takes one copy from.
local function fields(domain, groups)
  local f = { 'd:' .. domain, 'g' }
  for _, g in ipairs(groups) do f[#f + 1] = 'G:' .. g end
  return f
end

local function add(key, fs, n)
  for _, f in ipairs(fs) do redis.call('HINCRBY', key, f, fmt(n)) end
end

-- Takes `n` from each field, dropping fields that reach zero. A field that
-- would go negative is bad data; it is dropped (zero) rather than kept
-- negative, and counted in the return value.
local function sub(key, fs, n)
  local negative = 0
  for _, f in ipairs(fs) do
    local left = redis.call('HINCRBY', key, f, fmt(-n))
    if left <= 0 then
      redis.call('HDEL', key, f)
      if left < 0 then negative = negative + 1 end
    end
  end
  return negative
end

-- Current values of `fs` in `key` (0 when absent).
local function values(key, fs)
  local raw = redis.call('HMGET', key, unpack(fs))
  local v = {}
  for i = 1, #fs do v[i] = tonumber(raw[i]) or 0 end
  return v
end

-- The fields of the hold (`domain`, the groups in ARGV from `first_group`
-- on) that a release or transfer of `n` copies gives up, and, when this
-- server's contribution does not cover them, the error reply.
local function covered(contribution, domain, n, first_group)
  local groups = {}
  for i = first_group, #ARGV do groups[#groups + 1] = ARGV[i] end
  local fs = fields(domain, groups)
  local mine = values(contribution, fs)
  for i = 1, #fs do
    if mine[i] < n then return groups, fs, { 'short', fs[i], mine[i] } end
  end
  return groups, fs, nil
end

-- True when the cleanup of a dead server has marked this contribution:
-- a server that other servers consider dead must not touch counts again.
local function fenced(contribution)
  return redis.call('HEXISTS', contribution, '!') == 1
end

-- Releases every staged transfer whose ttl has passed (expired at
-- now >= staged_at + ttl, as in the in-memory store).
local function expire_staged(counts, staging, staging_exp, now)
  local ids = redis.call('ZRANGEBYSCORE', staging_exp, '-inf', fmt(now))
  if #ids == 0 then return 0 end
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', staging, id)
    if raw then
      local e = cmsgpack.unpack(raw)
      sub(counts, fields(e[3], e[4]), e[2])
      redis.call('HDEL', staging, id)
    end
  end
  redis.call('ZREMRANGEBYSCORE', staging_exp, '-inf', fmt(now))
  return #ids
end

-- Operation records. A copy operation whose reply is lost (a timeout, a
-- dropped connection) may or may not have run; the client was told it
-- failed. Each operation therefore names a record key (its own, in the
-- resource's slot): a run that changes state writes what it did there, and
-- undo.lua later either reverses it or, if it never ran, writes
-- 'cancelled' so that a late arrival does nothing. Records live for a
-- while (ARGV[2]) and then expire.
local function cancelled(record)
  return redis.call('EXISTS', record) == 1
end

local function remember(record, ttl, entry)
  redis.call('SET', record, cmsgpack.pack(entry), 'PX', ttl)
end
