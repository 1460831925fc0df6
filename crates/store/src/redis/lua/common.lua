-- Shared by every Charon script (prepended to each one by the Rust side).
--
-- Lua numbers are doubles: every count, limit and time Charon uses is an
-- integer below 2^53 (charon_core::MAX_COUNT), so they are exact here. Two
-- traps are avoided on purpose:
-- * redis.call() turns a number argument into text with "%.14g", which
--   rounds integers of 15 digits or more; every number sent to Redis goes
--   through fmt() instead.
-- * a Lua number returned to Redis becomes an integer reply; infinity has
--   no integer form, so "unbounded" travels as -1 both ways.

local INF = math.huge

-- charon_core::MAX_COUNT. Every count a store keeps stays at or below it
-- (the rule of charon_core::bound, repeated by reserve.lua and rate.lua),
-- so every count and sum in these scripts is exact and far from the
-- 2^63 at which HINCRBY stops.
local MAX_COUNT = 9007199254740991

-- charon_core::bound::check: whether `n` more keep a count now at `held`
-- within MAX_COUNT. Compared as a difference: held + n could be above 2^53,
-- where doubles skip integers.
local function within_bound(held, n)
  return n <= MAX_COUNT - held
end

-- An integer as Redis must read it.
local function fmt(x)
  return string.format('%.0f', x)
end

-- A limit argument: -1 is unbounded.
local function limit_arg(s)
  local x = tonumber(s)
  if x < 0 then return INF end
  return x
end

-- An optional limit argument: '' is none (unbounded as well).
local function optional_limit_arg(s)
  if s == '' then return INF end
  return limit_arg(s)
end

-- (now, redis_now): the decision's clock and Redis' own. The first is
-- Redis TIME in milliseconds unless a test clock passed its time in `arg`.
local function clock(arg)
  local t = redis.call('TIME')
  local redis_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if arg == '' then return redis_now, redis_now end
  return tonumber(arg), redis_now
end

-- Sets `key` to expire when the decision clock reaches `at`: translated to
-- Redis' clock (the same one unless a test clock is in use) plus `slack`
-- (0 in production; generous under a test clock, whose time does not move
-- with Redis'). Never (-1) and beyond 2^52 there is nothing to expire.
local function expire_at(key, at, now, redis_now, slack)
  if at < 0 or at >= 4503599627370496 then
    redis.call('PERSIST', key)
    return
  end
  redis.call('PEXPIREAT', key, fmt(at - now + redis_now + slack))
end
