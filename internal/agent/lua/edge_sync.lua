-- The region's edge reservations (docs/rlqs.md, "Reservations"): one hash
-- per region, a field per policy identity, holding one entry per agent
-- process: "id reserved edgeDemand directDemand expiresMs", one per line,
-- expiry on this server's clock. The script applies one agent's updates
-- and returns what every other live agent holds, atomically, so that two
-- agents growing at once never reserve more than the capacity between them.
-- Its cost is bounded by the caller, never by the hash's size: at most the
-- updates it is given, and one page of the hash read (HSCAN), so that a
-- decision's script never waits long behind it; a whole read is as many
-- calls as pages, each with the cursor the previous one returned.
--
-- KEYS[1]  the region's hash
-- ARGV[1]  the calling agent's id
-- ARGV[2]  n, the number of updates, then 6 per update:
--          field, wanted reservation, capacity (growth stops at it, counting
--          the others), edge demand, direct demand, lifetime in ms
-- then     the read's cursor ('' for no read: the updates alone) and the
--          page's size (HSCAN's COUNT)
-- Returns {now ms, {granted reservation per update}, {field, others'
-- reserved, others' edge demand, others' direct demand, ...} for the
-- fields the page read, the next cursor ('0' when the read is done, ''
-- when there was none)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, me, n = KEYS[1], ARGV[1], tonumber(ARGV[2])

local function parse(v)
  local out = {}
  if v then
    for id, r, e, d, x in string.gmatch(v, '(%S+) (%d+) (%d+) (%d+) (%d+)') do
      out[#out + 1] = {id, tonumber(r), tonumber(e), tonumber(d), tonumber(x)}
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
    lines[i] = e[1] .. ' ' .. num(e[2]) .. ' ' .. num(e[3]) .. ' ' .. num(e[4]) .. ' ' .. num(e[5])
  end
  redis.call('HSET', key, field, table.concat(lines, '\n'))
end

local granted, longest = {}, 0
for i = 0, n - 1 do
  local b = 3 + i * 6
  local field, want, cap = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local de, dd, life = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local old, others, keep = 0, 0, {}
  for _, e in ipairs(parse(redis.call('HGET', key, field))) do
    if e[5] > now then
      if e[1] == me then
        old = e[2]
      else
        others = others + e[2]
        keep[#keep + 1] = e
      end
    end
  end
  local r = want
  if want > old then -- growth: never past the capacity, counting the others
    r = math.max(old, math.min(want, cap - others))
  end
  r = math.max(0, r)
  if r > 0 or de > 0 or dd > 0 then
    keep[#keep + 1] = {me, r, de, dd, now + life}
    longest = math.max(longest, life)
  end
  store(field, keep)
  granted[#granted + 1] = num(r)
end

local cursor, page = ARGV[3 + n * 6], tonumber(ARGV[4 + n * 6])
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
