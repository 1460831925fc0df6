-- The decision of rate.lua: the burst search and the plan of
-- charon_core::rate::decide (SPEC §2 rules 3-5). After rate_state.lua.

-- decide ------------------------------------------------------------------

local function burst_target(st, tiers, from, now)
  for j = from + 1, #tiers do
    local tier = tiers[j]
    local blocked = tier.limit == 0 or phase(st, tiers, j, now) == COOLDOWN
    if not blocked then return j end
    if not tier.skippable then return nil end
  end
  return nil
end

-- The way `want` hits would go through the tiers, and how many would pass.
local function plan(st, tiers, current, now, want)
  local steps = {}
  local total = 0
  local at = current
  if at >= 1 then
    local room = math.max(tiers[at].limit - tier_hits(st, at), 0)
    local take = math.min(room, want)
    if take > 0 then
      steps[#steps + 1] = { tier = at, take = take, enter = false }
      total = total + take
    end
  end
  while total < want do
    local j = burst_target(st, tiers, at, now)
    if not j then break end
    local take = math.min(tiers[j].limit, want - total)
    steps[#steps + 1] = { tier = j, take = take, enter = true }
    total = total + take
    at = j
  end
  return steps, total
end

local function room(limit, used)
  return math.max(limit - used, 0)
end

