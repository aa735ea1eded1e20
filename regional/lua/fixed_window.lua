-- fixed_window.lua: aligned fixed windows; mirrors fixedWindow in fixedwindow.go.
-- Each window of a key has a counter of its own, k .. ':w' .. <window
-- index>, an integer of micro-units: the same counters the engine charges
-- without this script (regional/window.go), so that both kinds of decision
-- count in one place. The counter is built from the state key k, so it has
-- k's hash tag and slot. bk is the birth marker; w the window in ms;
-- force: count a charge that does not fit too, over the limit (a policy
-- taking charges after the fact). Returns allowed, remaining (negative:
-- the count over the limit), retry ms, reset ms and the time it decided
-- at (now, at least the floor).
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

local function fixed_window(k, bk, now, cap, w, cost, margin, _, force)
  now = math.max(now, fw_floor)
  -- A store that lost its memory at b: the window of the loss counts as
  -- used up (policy.Fresh), on top of what its counter holds.
  local used = 0
  local b = born(bk, now)
  if b > 0 and math.max(now, b) < (math.floor(b / w) + 1) * w then
    now = math.max(now, b)
    used = cap
  end
  local ck = fw_counter(k, now, w)
  local e = (math.floor(now / w) + 1) * w
  local count = used + (tonumber(redis.call('GET', ck)) or 0)
  local fits = count + cost <= cap
  if fits or force then -- a check (cost 0) counts nothing, and starts the window's counter
    count = used + redis.call('INCRBY', ck, int(math.min(cost, cap + max_debt - count)))
    redis.call('PEXPIRE', ck, int(e - now + margin), 'NX')
  end
  if fits then return 1, cap - count, 0, e - now, now end
  return 0, cap - count, e - now, e - now, now
end
