-- The region's edge reservations (docs/rlqs.md, "Reservations"): one hash
-- per region, a field per policy identity, holding one entry per agent
-- process: "id reserved edgeDemand directDemand expiresMs places", one per
-- line, expiry on this server's clock (places, the Envoy instances the
-- agent assigns to, may be missing: 0). The script applies one agent's
-- updates and returns what every other live agent holds, atomically, so
-- that two agents growing at once never reserve more than the capacity,
-- nor hold more places than the policy's instances, between them.
-- Its cost is bounded by the caller, never by the hash's size: at most the
-- updates it is given, and one page of the hash read (HSCAN), so that a
-- decision's script never waits long behind it; a whole read is as many
-- calls as pages, each with the cursor the previous one returned.
--
-- KEYS[1]  the region's hash
-- ARGV[1]  the calling agent's id
-- ARGV[2]  the id of the process it succeeded ('' for none): that
--          process's Envoy instances are the caller's now, so its places
--          do not count against the caller's (its reservations do)
-- ARGV[3]  n, the number of updates, then 8 per update:
--          field, wanted reservation, capacity (growth stops at it, counting
--          the others), edge demand, direct demand, lifetime in ms, wanted
--          places, most places (the policy's instances)
-- then     the read's cursor ('' for no read: the updates alone) and the
--          page's size (HSCAN's COUNT)
-- Returns {now ms, {granted reservation, granted places, ...} per update,
-- {field, others' reserved, others' edge demand, others' direct demand,
-- ...} for the fields the page read, the next cursor ('0' when the read is
-- done, '' when there was none)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, me, heir, n = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local width = 8

local function parse(v)
  local out = {}
  if v then
    for id, r, e, d, x, p in string.gmatch(v, '(%S+) (%d+) (%d+) (%d+) (%d+) ?(%d*)') do
      out[#out + 1] = {id, tonumber(r), tonumber(e), tonumber(d), tonumber(x), tonumber(p) or 0}
    end
  end
  return out
end

local function num(x) return string.format('%.0f', x) end

local function store(field, es)
  if #es == 0 then
    redis.call('HDEL', key, field)
    return
  end
  local lines = {}
  for i, e in ipairs(es) do
    lines[i] = e[1] .. ' ' .. num(e[2]) .. ' ' .. num(e[3]) .. ' ' .. num(e[4]) .. ' ' .. num(e[5]) .. ' ' .. num(e[6])
  end
  redis.call('HSET', key, field, table.concat(lines, '\n'))
end

-- edge.Reserve: a smaller want whole; growth never past the capacity,
-- counting the others.
local function reserve(want, old, cap, others)
  local r = want
  if want > old then
    r = math.max(old, math.min(want, cap - others))
  end
  return math.max(0, r)
end

local granted, longest = {}, 0
for i = 0, n - 1 do
  local b = 4 + i * width
  local field, want, cap = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local de, dd, life = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local wantP, most = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  local old, oldP, others, othersP, keep = 0, 0, 0, 0, {}
  for _, e in ipairs(parse(redis.call('HGET', key, field))) do
    if e[5] > now then
      if e[1] == me then
        old, oldP = e[2], e[6]
      else
        others = others + e[2]
        if e[1] ~= heir then
          othersP = othersP + e[6]
        end
        keep[#keep + 1] = e
      end
    end
  end
  local r, p = reserve(want, old, cap, others), reserve(wantP, oldP, most, othersP)
  if r > 0 or p > 0 or de > 0 or dd > 0 then
    keep[#keep + 1] = {me, r, de, dd, now + life, p}
    longest = math.max(longest, life)
  end
  store(field, keep)
  granted[#granted + 1] = num(r)
  granted[#granted + 1] = num(p)
end

local cursor, page = ARGV[4 + n * width], tonumber(ARGV[5 + n * width])
if longest > 0 and redis.call('PTTL', key) < longest then
  redis.call('PEXPIRE', key, longest)
end
if cursor == nil or cursor == '' then
  return {num(now), granted, {}, ''}
end
local scan = redis.call('HSCAN', key, cursor, 'COUNT', page)
local sums, all, mine = {}, scan[2], me .. ' '
for i = 1, #all, 2 do
  local field, v, live, sr, se, sd, dead = all[i], all[i + 1], {}, 0, 0, 0, false
  -- A field holding only the caller's entry has nothing to sum, and the
  -- caller rewrites or drops it: skipped without parsing (most fields,
  -- where each identity is served by one agent).
  if string.sub(v, 1, #mine) == mine and not string.find(v, '\n', 1, true) then
    v = nil
  end
  for _, e in ipairs(parse(v)) do
    if e[5] > now then
      live[#live + 1] = e
      if e[1] ~= me then
        sr, se, sd = sr + e[2], se + e[3], sd + e[4]
      end
    else
      dead = true
    end
  end
  if dead then
    store(field, live)
  end
  if sr > 0 or se > 0 or sd > 0 then
    sums[#sums + 1] = field
    sums[#sums + 1] = num(sr)
    sums[#sums + 1] = num(se)
    sums[#sums + 1] = num(sd)
  end
end
return {num(now), granted, sums, scan[1]}
