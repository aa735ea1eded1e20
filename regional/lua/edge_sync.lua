-- The region's edge reservations (docs/rlqs-server.md, "Reservations"):
-- one hash per region, a field per policy identity, holding one entry per
-- agent process: "id reserved edgeDemand directDemand expiresMs places
-- largest life", one per line, expiry on this server's clock (places, the
-- Envoy instances the agent assigns to, and largest, the most one of them
-- may enforce, may be missing: 0, unknown; life may be missing: 0,
-- none). The script applies one agent's updates and reads what the other
-- agents hold, atomically, so that two agents growing at once never
-- reserve more than the capacity, nor hold more places than the policy's
-- instances, between them.
--
-- An entry written in a life of its agent also ends with that life: every
-- call that says how long (ARGV[3]) keeps the caller alive that much longer,
-- in a hash of its own (agent id -> "until start", ms, start naming the
-- life), and such an entry ("life" its start) counts only until the sooner
-- of its expiry and the end of that life. So an agent keeps entries whose
-- reservation does not change with one write per call, not one per entry,
-- and a dead agent's entries end soon after its last call however long
-- they were written for. An agent that calls again after its life ended
-- (it was paused) starts another: what it wrote in the last one stays
-- over. Entries of no life (0) end at their own expiry alone.
--
-- Reads cost what changed, not what the hash holds: every field written
-- is logged in a sorted set, scored by a counter the hash's writes share,
-- so an agent reads the fields changed since the score it last read
-- ('log'). A whole read ('full', HSCAN) starts an agent, follows a lost
-- store (the counter's epoch changed) or a log trimmed past it, and sweeps
-- the entries of agents that stopped (an entry outlives neither its expiry
-- nor its life), now and then. Every call's cost is bounded by the caller
-- and the region's agents, never by the hash's size: the updates it is
-- given, one page of the read and, with a read, the agents' lives, so that
-- a decision's script never waits long behind it.
--
-- KEYS[1]  the region's hash; KEYS[2] its log (sorted set: field -> the
--          counter at its last write); KEYS[3] the counter (hash: epoch,
--          seq, floor: the highest score trimmed from the log); KEYS[4] the
--          agents' lives (hash: agent id -> "until start", ms, of its last life)
-- ARGV[1]  the calling agent's id
-- ARGV[2]  the id of the process it succeeded ('' for none): that
--          process's Envoy instances reconnect to the caller, so its entry
--          moves to the caller's (its reservation and places, which the
--          caller counts until the entry would have expired: edge/inherit.go),
--          and should it write again it grows from none, counting the
--          caller's
-- ARGV[3]  how long, in ms, the caller stays alive from now, its updates
--          written in that life; 0: its life is left as it was, and its
--          updates are written in none (they end at their own expiry)
-- ARGV[4]  n, the number of updates, then 9 per update:
--          field, wanted reservation, capacity (growth stops at it, counting
--          the others), edge demand, direct demand, lifetime in ms, wanted
--          places, most places (the policy's instances), largest share
-- then     the read: '' (none), 'full' with the HSCAN cursor and COUNT, or
--          'log' with the score read up to, the page's size and the epoch
--          it was read in
-- Returns {now ms, {granted reservation, granted places, and what moved
-- from the process succeeded: reservation, largest, places, ms left, edge
-- and direct demand, ...} per update,
-- {field, value, ...} the page read (a field holding only the caller's
-- entry has value '': nothing of the others), next ('0' when the read is
-- done, '' when there was none, 'reset' when a log read must read whole
-- instead; else the cursor or score to go on from), epoch, seq (the
-- counter after this call's writes), {agent id, "until start", ...} every
-- agent alive (with a read only), the start of the caller's life (0: none)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, logkey, seqkey, alivekey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, heir, aliveFor, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local width, first = 9, 5

local function parse(v)
  local out = {}
  if v then
    for id, r, e, d, x, p, l, b in string.gmatch(v, '(%S+) (%d+) (%d+) (%d+) (%d+) ?(%d*) ?(%d*) ?(%d*)') do
      out[#out + 1] = {id, tonumber(r), tonumber(e), tonumber(d), tonumber(x), tonumber(p) or 0, tonumber(l) or 0, tonumber(b) or 0}
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
    lines[i] = e[1] .. ' ' .. num(e[2]) .. ' ' .. num(e[3]) .. ' ' .. num(e[4]) .. ' ' .. num(e[5]) .. ' ' .. num(e[6]) .. ' ' .. num(e[7]) .. ' ' .. num(e[8])
  end
  redis.call('HSET', key, field, table.concat(lines, '\n'))
end

-- lifeOf is each agent's life as looked up this call: {until, start}
-- ({0, 0}: none recorded, over).
local lifeCache = {}
local function lifeOf(id)
  if lifeCache[id] == nil then
    local v = redis.call('HGET', alivekey, id)
    local u, st = string.match(v or '', '^(%d+) (%d+)$')
    lifeCache[id] = {tonumber(u) or 0, tonumber(st) or 0}
  end
  return lifeCache[id]
end

-- keepAlive makes the caller's life last at least until endMs, starting
-- another if the last one ended.
local function keepAlive(endMs)
  local l = lifeOf(me)
  if l[1] <= now then
    l = {now, now}
  end
  if endMs > l[1] then
    lifeCache[me] = {endMs, l[2]}
    redis.call('HSET', alivekey, me, num(endMs) .. ' ' .. num(l[2]))
    if redis.call('PTTL', alivekey) < endMs - now then
      redis.call('PEXPIRE', alivekey, endMs - now)
    end
  end
end

-- ends is when entry e stops counting: its expiry, or the end of the life
-- it was written in if sooner (a life over, or not the agent's last: now).
local function ends(e)
  if e[8] == 0 then
    return e[5]
  end
  local l = lifeOf(e[1])
  if l[2] ~= e[8] then
    return 0
  end
  return math.min(e[5], l[1])
end

local life = 0 -- the life the caller's updates are written in
if aliveFor > 0 then
  keepAlive(now + aliveFor)
  life = lifeOf(me)[2]
end

-- The counter's epoch names one life of the store: a store that lost its
-- keys starts another, and every log read from before it reads whole.
local epoch = redis.call('HGET', seqkey, 'epoch')
if not epoch and n > 0 then
  epoch = t[1] .. '.' .. t[2]
  redis.call('HSET', seqkey, 'epoch', epoch)
end
epoch = epoch or ''

-- logged stores a field's entries and logs the write under the writer's
-- name ("id field"), so that a reader passes over its own writes without
-- reading them: they change only its own entry, which it knows.
local function logged(field, es, writer)
  store(field, es)
  redis.call('ZADD', logkey, redis.call('HINCRBY', seqkey, 'seq', 1), (writer or me) .. ' ' .. field)
end

-- A field is logged at each writer's last write only, so the log holds a
-- member per field and writer, those whose entry is gone too (readers
-- learn of the removal). The oldest members, logHorizon writes back, are
-- trimmed a few per call: one whose writer's entry is gone is dropped,
-- raising the floor below which a log read reads whole; one still there
-- is logged again (read again, unchanged), so the trim goes on past it.
local logHorizon, trimPerCall = 100000, 8

-- writerOf splits a log member into its writer and field.
local function writerOf(member)
  local sp = string.find(member, ' ', 1, true)
  return string.sub(member, 1, sp - 1), string.sub(member, sp + 1)
end

local function trim()
  local seq = tonumber(redis.call('HGET', seqkey, 'seq') or '0')
  local old = redis.call('ZRANGE', logkey, 0, trimPerCall - 1, 'WITHSCORES')
  local floor = 0
  for i = 1, #old, 2 do
    local score = tonumber(old[i + 1])
    if score >= seq - logHorizon then
      break
    end
    local writer, field = writerOf(old[i])
    local v = redis.call('HGET', key, field)
    if v and (string.sub(v, 1, #writer + 1) == writer .. ' ' or string.find(v, '\n' .. writer .. ' ', 1, true)) then
      redis.call('ZADD', logkey, redis.call('HINCRBY', seqkey, 'seq', 1), old[i])
    else
      redis.call('ZREM', logkey, old[i])
      floor = score
    end
  end
  if floor > 0 then
    redis.call('HSET', seqkey, 'floor', num(floor))
  end
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
  local b = first + i * width
  local field, want, cap = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local de, dd, lifeMs = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local wantP, most, largest = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]), tonumber(ARGV[b + 8])
  local old, oldP, others, othersP, keep = 0, 0, 0, 0, {}
  local inh = {0, 0, 0, 0, 0, 0} -- reservation, largest, places, ms left, demands moved from the heir
  for _, e in ipairs(parse(redis.call('HGET', key, field))) do
    local endMs = ends(e)
    if endMs > now then
      if e[1] == me then
        old, oldP = e[2], oldP + e[6]
      elseif e[1] == heir then
        -- Its reservation counts among the others' for the caller's own
        -- growth, and then moves to the caller's entry; its places are
        -- the caller's.
        inh = {e[2], e[7], e[6], endMs - now, e[3], e[4]}
        others, oldP = others + e[2], oldP + e[6]
      else
        others, othersP = others + e[2], othersP + e[6]
        keep[#keep + 1] = e
      end
    end
  end
  local r, p = reserve(want, old, cap, others) + inh[1], reserve(wantP, oldP, most, othersP)
  if r > 0 or p > 0 or de > 0 or dd > 0 then
    keep[#keep + 1] = {me, r, de, dd, now + math.max(lifeMs, inh[4]), p, math.max(largest, inh[2]), life}
    longest = math.max(longest, lifeMs, inh[4])
    if life > 0 then
      -- What moved counts until the assignments under it may have
      -- expired, whenever the caller's life would end.
      keepAlive(now + inh[4])
    end
  end
  if inh[1] > 0 or inh[3] > 0 then
    -- Logged as the heir's write, so that the caller's next read reads
    -- the field again, without the heir's entry it counted until now.
    logged(field, keep, heir)
  else
    logged(field, keep)
  end
  granted[#granted + 1] = num(r)
  granted[#granted + 1] = num(p)
  for _, x in ipairs(inh) do
    granted[#granted + 1] = num(x)
  end
end

if n > 0 then
  trim()
end
local seq = tonumber(redis.call('HGET', seqkey, 'seq') or '0')
-- The keys live as long as the longest entry (an expiry of -1, none yet,
-- is below any); a call that only removed entries gives the log, its
-- counter and the lives the hash's expiry, or a minute when the hash is
-- gone. The lives last at least as long as the entries written in them
-- (keepAlive), so that no eviction by expiry takes them first.
if longest == 0 and n > 0 then
  longest = math.max(60000, redis.call('PTTL', key))
end
for _, k in ipairs({key, logkey, seqkey, alivekey}) do
  if longest > 0 and redis.call('PTTL', k) < longest then
    redis.call('PEXPIRE', k, longest)
  end
end

local r = first + n * width
local mode, from, page = ARGV[r], ARGV[r + 1], tonumber(ARGV[r + 2])
local mine = me .. ' '

-- others is v as the caller reads it: '' when it holds only the caller's
-- entry (most fields, where each identity is served by one agent), which
-- it rewrites or drops itself.
local function others(v)
  if not v or (string.sub(v, 1, #mine) == mine and not string.find(v, '\n', 1, true)) then
    return ''
  end
  return v
end

-- lives lists every agent alive, for a read; those over are dropped
-- (entries of a life that is not recorded are over too).
local function lives()
  local out, all = {}, redis.call('HGETALL', alivekey)
  for i = 1, #all, 2 do
    if (tonumber(string.match(all[i + 1], '^%d+')) or 0) > now then
      out[#out + 1] = all[i]
      out[#out + 1] = all[i + 1]
    else
      redis.call('HDEL', alivekey, all[i])
    end
  end
  return out
end

local out = {}
if mode == 'log' then
  local floor = tonumber(redis.call('HGET', seqkey, 'floor') or '0')
  if ARGV[r + 3] ~= epoch or tonumber(from) < floor then
    return {num(now), granted, {}, 'reset', epoch, num(seq), {}, num(life)}
  end
  -- A call passes over up to eight pages of members, the caller's own
  -- writes without a read, and returns the others' fields.
  local scan = 8 * page
  local changed = redis.call('ZRANGEBYSCORE', logkey, '(' .. from, '+inf', 'WITHSCORES', 'LIMIT', 0, scan)
  local next = '0'
  for i = 1, #changed, 2 do
    local writer, field = writerOf(changed[i])
    if writer ~= me then
      out[#out + 1] = field
      out[#out + 1] = others(redis.call('HGET', key, field))
    end
    next = changed[i + 1]
  end
  if #changed < 2 * scan then
    next = '0'
  end
  return {num(now), granted, out, next, epoch, num(seq), lives(), num(life)}
end
if mode ~= 'full' then
  return {num(now), granted, {}, '', epoch, num(seq), {}, num(life)}
end
local scan = redis.call('HSCAN', key, from, 'COUNT', page)
local all = scan[2]
for i = 1, #all, 2 do
  local field, v, live, dead = all[i], others(all[i + 1]), {}, false
  for _, e in ipairs(parse(v)) do
    if ends(e) > now then
      live[#live + 1] = e
    else
      dead = true
    end
  end
  -- An agent that stopped left entries that expired unwritten: dropped
  -- (readers drop them by their expiry, so this needs no log).
  if dead then
    store(field, live)
  end
  if v ~= '' then
    out[#out + 1] = field
    out[#out + 1] = v
  end
end
return {num(now), granted, out, scan[1], epoch, num(seq), lives(), num(life)}
