-- decide.lua: the tail of the decision script (see regional/script.go). One
-- call decides one or more requests in order, each exactly as if it ran
-- alone: a later decision on the same key sees what an earlier one charged.
--
-- ARGV[1]  now in ms, or '' to read the Redis server clock (now.lua)
-- ARGV[2]  the engine's floor for fixed windows, in ms (fixed_window.lua)
-- ARGV[3]  a reservation's lifetime in ms (reservation.lua)
-- then six per decision:
--   algorithm   tb | fw | sw | sl, followed for a policy that accepts
--               returns (returns.lua) by '+' (a charge, recorded in the
--               ledger when admitted) or '-' (a return: cost is the units
--               returned, which may exceed the capacity), for one that
--               takes charges after the fact by '!' (a charge counted
--               whether or not it fits, which may exceed the capacity),
--               '^' (a reservation: a charge that must fit, recorded under
--               its idempotency key for its settlement) or '=' (a
--               settlement: cost is the actual cost; reservation.lua)
--   idempotency window in ms; when > 0 the decision's last key is its
--               idempotency key, and a decision already made for it is replayed
--               (required for '^' and '='; an admitted reservation's record
--               and a settlement's answer live ARGV[3] instead)
--   capacity in micro-units
--   refill rate in micro-units/s (tb) or window in ms
--   cost in micro-units
--   margin added to every key's TTL, in ms
-- KEYS, per decision in order: its state key; the store's birth marker; the
--   sliding log's meta key (sl only); a settlement's reservation record (the
--   reservation's idempotency key; '=' only); its idempotency key (window >
--   0 only).
--
-- Returns one reply per decision: {allowed (0|1), remaining (negative when
-- the key is over its limit: policy.Decision.Debt), retry_after_ms,
-- reset_after_ms, replayed (0|1)}, a return's (not replayed) followed by
-- the micro-units it matched and freed, or a string saying why that decision
-- failed ('ERR no reservation' for a settlement whose record is gone). (Not an error reply: a client stops reading a reply at a nested
-- error it does not expect, and the decisions after it would be lost.)
local algorithms = {tb = token_bucket, fw = fixed_window, sw = sliding_window, sl = sliding_log}
local stride = 6

local rsv_ttl = tonumber(ARGV[3])

local function decide(alg, kind, ks, nk, idem_ttl, cap, param, cost, margin)
  local idem_key = nil
  if idem_ttl > 0 then
    idem_key = KEYS[ks + nk - 1]
    local prev = redis.call('GET', idem_key)
    if prev then
      local a, r, ra, rs = string.match(prev, '^(%d+):(%-?%d+):(%d+):(%d+)')
      if a then
        return {tonumber(a), tonumber(r), tonumber(ra), tonumber(rs), 1}
      end
    end
  end
  if cost < 0 or (cost < 1 and kind == '-') or (cost > cap and kind ~= '-' and kind ~= '!' and kind ~= '=') then
    return 'ERR cost outside [0, capacity]'
  end
  local mk = nil
  if alg == 'sl' then mk = KEYS[ks + 2] end
  local allowed, remaining, retry, reset, matched, freed, at
  if kind == '=' then
    allowed, remaining, retry, reset =
      settle(alg, algorithms[alg], KEYS[ks], KEYS[ks + 1], now, cap, param, cost, margin, mk, KEYS[ks + nk - 2])
    if allowed == nil then return 'ERR no reservation' end
  elseif kind == '-' then
    allowed, remaining, retry, reset, matched, freed =
      give_back(alg, algorithms[alg], KEYS[ks], KEYS[ks + 1], now, cap, param, cost, margin, mk)
  elseif kind == '+' then
    allowed, remaining, retry, reset =
      take_held(alg, algorithms[alg], KEYS[ks], KEYS[ks + 1], now, cap, param, cost, margin, mk)
  else
    allowed, remaining, retry, reset, at =
      algorithms[alg](KEYS[ks], KEYS[ks + 1], now, cap, param, cost, margin, mk, kind == '!')
  end
  if idem_key then
    local rec = int(allowed) .. ':' .. int(remaining) .. ':' .. int(retry) .. ':' .. int(reset)
    local ttl = idem_ttl
    if kind == '^' then
      -- admitted, the record waits for the settlement; refused (admitted
      -- by shadow mode at most), it reserved nothing, and a settlement
      -- charges the whole actual cost
      if allowed == 1 then rec = rec .. rsv_suffix(cost, at); ttl = rsv_ttl
      else rec = rec .. rsv_suffix(0, at) end
    elseif kind == '=' then
      ttl = rsv_ttl -- answered again while its reservation's record may live
    end
    redis.call('SET', idem_key, rec, 'PX', int(ttl))
  end
  if kind == '-' then return {allowed, remaining, retry, reset, 0, matched, freed} end
  return {allowed, remaining, retry, reset, 0}
end

-- Check the call's shape before deciding anything, so that a malformed
-- call changes nothing.
local n = (#ARGV - 3) / stride
if n < 1 or n ~= math.floor(n) or rsv_ttl == nil or rsv_ttl < 1 then
  return redis.error_reply('ERR want 3 + 6 arguments per decision, got ' .. #ARGV)
end
local nks, algs, kinds, total = {}, {}, {}, 0
for i = 1, n do
  local b = 4 + (i - 1) * stride
  local alg, kind = string.match(ARGV[b], '^(%l%l)([+!^=-]?)$')
  local idem = tonumber(ARGV[b + 1])
  if alg == nil or algorithms[alg] == nil or idem == nil or ((kind == '^' or kind == '=') and idem <= 0) then
    return redis.error_reply('ERR decision ' .. i .. ': bad algorithm or idempotency window')
  end
  local nk = 2
  if alg == 'sl' then nk = 3 end
  if kind == '=' then nk = nk + 1 end
  if idem > 0 then nk = nk + 1 end
  nks[i], algs[i], kinds[i] = nk, alg, kind
  total = total + nk
end
if total ~= #KEYS then
  return redis.error_reply('ERR the decisions need ' .. total .. ' keys, got ' .. #KEYS)
end

local out, ks = {}, 1
for i = 1, n do
  local b = 4 + (i - 1) * stride
  local ok, res = pcall(decide, algs[i], kinds[i], ks, nks[i], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
    tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]))
  if not ok then
    if type(res) == 'table' then res = res.err end
    res = tostring(res)
  end
  out[i] = res
  ks = ks + nks[i]
end
return out
