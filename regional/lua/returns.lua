-- returns.lua: returns (Envoy's is_negative_hits) for policies that accept
-- them; mirrors ApplyHeld and Return in policy/returns.go, which says why
-- a return frees what it frees.
--
-- The ledger is field u of the state's hash (the sliding log's meta hash;
-- a fixed window's, whose counts are its counters, holds only the ledger
-- and the time, l, and lives a window past its last decision):
-- the micro-units admitted and not yet returned, kept by the decisions of
-- such a policy (decide.lua, codes ending in '+': take_held) and
-- saturating at max_held; field r, the micro-units of refused charges
-- whose returns may still come; and for a token bucket field a, what its
-- charges took that refill has not restored. They live and expire with
-- the state.
local max_held = 4503599627370496 -- 2^52, policy.MaxHeld

-- held_key is the hash holding the ledger of a decision on k.
local function held_key(alg, k, mk)
  if alg == 'sl' then return mk end
  return k
end

-- touch_window keeps a fixed window's hash k, which holds the ledger
-- beside its counters: the time of its last decision (at least the
-- engine's floor) and a TTL of a window w past it.
local function touch_window(k, now, w, margin)
  local _, at = fw_counter(k, now, w)
  redis.call('HSET', k, 'l', int(at))
  redis.call('PEXPIRE', k, int(w + margin))
end

-- unrefilled is what a token bucket's charges took that refill has not
-- restored, now that its key k went from tokens t0 (nil: no state) with
-- a0 unrefilled to what it holds, charging charged: a0 less the refill
-- between (oldest first), plus charged, at most the deficit.
local function unrefilled(k, cap, t0, a0, charged)
  local t = tonumber(redis.call('HGET', k, 't'))
  local a = charged
  if t0 ~= nil then
    a = a + math.max(0, (a0 or 0) - (t + charged - math.min(cap, t0)))
  end
  return math.min(a, cap - t)
end

-- take_held decides a charge of a policy that accepts returns with the
-- algorithm's function fn, and records what it admitted, or that it
-- refused it. Returns what fn does.
local function take_held(alg, fn, k, bk, now, cap, param, cost, margin, mk)
  local before = nil
  if alg == 'tb' then before = redis.call('HMGET', k, 't', 'a') end
  local allowed, remaining, retry, reset = fn(k, bk, now, cap, param, cost, margin, mk)
  local charged = 0
  if allowed == 1 then charged = cost end
  if alg == 'tb' then
    redis.call('HSET', k, 'a', int(unrefilled(k, cap, tonumber(before[1]), tonumber(before[2]), charged)))
  end
  if alg == 'fw' then touch_window(k, now, param, margin) end
  local field = 'u'
  if charged == 0 then field = 'r' end
  local hk = held_key(alg, k, mk)
  local n = tonumber(redis.call('HGET', hk, field)) or 0
  redis.call('HSET', hk, field, int(math.min(max_held, n + cost)))
  return allowed, remaining, retry, reset
end

-- give_back returns units micro-units to the state of key k under the
-- algorithm alg, whose function is fn: it brings the state to now with a
-- charge of 0, matches the units against the ledger and frees the part
-- the state still counts, oldest first. A state that does not exist holds
-- nothing and is not written. Returns allowed (1), remaining, retry (0),
-- reset, matched and freed.
local function give_back(alg, fn, k, bk, now, cap, param, units, margin, mk)
  local hk = held_key(alg, k, mk)
  local st = redis.call('HMGET', hk, 'l', 'u', 'r')
  if not st[1] then
    return 1, cap, 0, 0, 0, 0
  end
  local held, refused = tonumber(st[2]) or 0, tonumber(st[3]) or 0
  local before = nil
  if alg == 'tb' then before = redis.call('HMGET', k, 't', 'a') end
  fn(k, bk, now, cap, param, 0, margin, mk)
  local ref = math.min(units, refused) -- a refused request's return: frees nothing
  local matched = math.min(units - ref, held)
  -- the part of matched the state still counts, where it counts c of
  -- what is held: the rest of held is older than anything it counts
  local function counted(c) return matched - math.min(matched, math.max(0, held - c)) end
  local freed = 0
  if alg == 'tb' then
    local a = unrefilled(k, cap, tonumber(before[1]), tonumber(before[2]), 0)
    local t = tonumber(redis.call('HGET', k, 't'))
    freed = counted(a)
    redis.call('HSET', k, 't', int(t + freed), 'a', int(a - freed))
  elseif alg == 'fw' then
    local ck = fw_counter(k, now, param)
    freed = counted(tonumber(redis.call('GET', ck)) or 0)
    if freed > 0 then redis.call('DECRBY', ck, int(freed)) end
    touch_window(k, now, param, margin)
  elseif alg == 'sw' then
    local pc = redis.call('HMGET', k, 'p', 'c')
    local p, c = tonumber(pc[1]), tonumber(pc[2])
    local r = counted(p + c)
    local fp = math.min(r, p)
    local fc = math.min(r - fp, c)
    freed = fp + fc
    redis.call('HSET', k, 'p', int(p - fp), 'c', int(c - fc))
  else -- sl: the oldest entries first
    local sum = tonumber(redis.call('HGET', mk, 's'))
    local r = counted(sum)
    freed = r
    while r > 0 do
      local e = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
      if #e == 0 then break end
      local ec = entry_cost(e[1])
      local take = math.min(r, ec)
      redis.call('ZREM', k, e[1])
      if ec > take then
        redis.call('ZADD', k, e[2], (string.gsub(e[1], ':%d+$', ':' .. int(ec - take))))
      end
      r = r - take
    end
    freed = freed - r
    redis.call('HSET', mk, 's', int(sum - freed))
  end
  redis.call('HSET', hk, 'u', int(held - matched), 'r', int(refused - ref))
  local _, remaining, _, reset = fn(k, bk, now, cap, param, 0, margin, mk)
  return 1, remaining, 0, reset, ref + matched, freed
end
