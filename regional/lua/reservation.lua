-- reservation.lua: reservations and their settlements (decide.lua's codes
-- ending in '^' and '='); mirrors Settle in policy/reservation.go, which
-- says what a settlement frees.
--
-- A reservation is a charge that must fit, decided with an idempotency
-- key (the reservation's id): its record, kept for the reservation's
-- lifetime, is the decision's idempotency record followed by the
-- reservation's cost and the time it counted at (rsv_suffix; a cost of 0
-- for a refused one). A settlement marks the record settled (a retried
-- reservation is still answered from it) and answers under an
-- idempotency key of its own, which lives as long as the record may.

-- rsv_suffix is what an admitted reservation of cost at time at adds to
-- its idempotency record.
local function rsv_suffix(cost, at) return ':' .. int(cost) .. ':' .. int(at) end

-- give_back_reserved frees up to u micro-units of the reservation of cost
-- e counted at time at, from the state of key k (brought to now).
local function give_back_reserved(alg, k, now, cap, param, u, e, at, mk)
  if u <= 0 then return end
  if alg == 'fw' then
    local ck, t = fw_counter(k, now, param)
    if math.floor(at / param) == math.floor(t / param) then
      local n = tonumber(redis.call('GET', ck)) or 0
      if n > 0 then redis.call('DECRBY', ck, int(math.min(u, n))) end
    end
  elseif alg == 'sw' then
    local st = redis.call('HMGET', k, 'w', 'p', 'c')
    local idx, p, c = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
    if idx == nil then return end
    local r = math.floor(at / param)
    if r == idx then
      redis.call('HSET', k, 'c', int(c - math.min(u, c)))
    elseif r == idx - 1 then
      redis.call('HSET', k, 'p', int(p - math.min(u, p)))
    end
  elseif alg == 'sl' then
    local found = redis.call('ZRANGEBYSCORE', k, int(at), int(at))
    for i = 1, #found do
      if entry_cost(found[i]) == e then
        redis.call('ZREM', k, found[i])
        if e > u then
          redis.call('ZADD', k, int(at), (string.gsub(found[i], ':%d+$', ':' .. int(e - u))))
        end
        redis.call('HINCRBY', mk, 's', int(-u))
        return
      end
    end
  else -- tb
    local st = redis.call('HMGET', k, 't', 'l')
    local t, l = tonumber(st[1]), tonumber(st[2])
    if t == nil then return end
    local free = math.min(u - muldiv(math.max(0, l - at), param, 1000, true), cap - t)
    if free > 0 then redis.call('HSET', k, 't', int(t + free)) end
  end
end

-- settle settles the reservation recorded at rk with the actual cost:
-- above the reservation's cost the difference is charged by fn, counted
-- whether or not it fits; below it, the difference is given back. Returns
-- what a decision returns, or nil when rk holds no reservation (never
-- made, expired, or settled already, whose answer the settlement's own
-- idempotency record gives first).
local function settle(alg, fn, k, bk, now, cap, param, actual, margin, mk, rk)
  local rec = redis.call('GET', rk)
  local e, at = nil, nil
  if rec then e, at = string.match(rec, '^[01]:%-?%d+:%d+:%d+:(%d+):(%d+)$') end
  if e == nil then return nil end
  redis.call('SET', rk, rec .. ':settled', 'KEEPTTL')
  e, at = tonumber(e), tonumber(at)
  if actual > e then
    return fn(k, bk, now, cap, param, actual - e, margin, mk, true)
  end
  fn(k, bk, now, cap, param, 0, margin, mk, false) -- brought to now
  give_back_reserved(alg, k, now, cap, param, e - actual, e, at, mk)
  local _, remaining, _, reset = fn(k, bk, now, cap, param, 0, margin, mk, false)
  return 1, remaining, 0, reset
end
