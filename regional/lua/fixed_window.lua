-- fixed_window.lua: aligned fixed windows; mirrors fixedWindow in fixedwindow.go.
-- Each window of a key has a counter of its own, k .. ':w' .. <window
-- index>, an integer of micro-units: the same counters the engine charges
-- without this script (regional/window.go), so that both kinds of decision
-- count in one place. The counter is built from the state key k, so it has
-- k's hash tag and slot. bk is the birth marker; w the window in ms.
-- Returns allowed, remaining, retry ms, reset ms.
--
-- ARGV[2] is the engine's floor: no fixed-window decision of the engine is
-- made at an earlier time (a clock stepped back mints nothing).
local fw_floor = tonumber(ARGV[2]) or 0

-- fw_counter is the counter k's decision at now counts in, and now as the
-- fixed window sees it (at least the floor).
local function fw_counter(k, now, w)
  now = math.max(now, fw_floor)
  return k .. ':w' .. int(math.floor(now / w)), now
end

local function fixed_window(k, bk, now, cap, w, cost, margin)
  now = math.max(now, fw_floor)
  -- A store that lost its memory at b: the window of the loss counts as
  -- used up (policy.Fresh), whatever its counter holds.
  local b = born(bk, now)
  if b > 0 and math.max(now, b) < (math.floor(b / w) + 1) * w then
    now = math.max(now, b)
    local e = (math.floor(now / w) + 1) * w
    return 0, 0, e - now, e - now
  end
  local ck = fw_counter(k, now, w)
  local e = (math.floor(now / w) + 1) * w
  local count = tonumber(redis.call('GET', ck)) or 0
  if count + cost <= cap then
    count = redis.call('INCRBY', ck, int(cost))
    redis.call('PEXPIRE', ck, int(e - now + margin), 'NX')
    return 1, cap - count, 0, e - now
  end
  local remaining = cap - count
  if remaining < 0 then remaining = 0 end
  return 0, remaining, e - now, e - now
end
