-- prelude.lua: shared head of every decision script (see regional/script.go).
--
-- KEYS[1]  the state key; KEYS[2] the store's birth marker (see born below);
--          KEYS[#KEYS] the idempotency key when ARGV[2] > 0
--
-- ARGV[1]  now in ms, or '' to read the Redis server clock (TIME)
-- ARGV[2]  idempotency window in ms; when > 0, KEYS[#KEYS] is the
--          idempotency key and a decision already made for it is replayed
-- ARGV[3]  capacity in micro-units
-- ARGV[4]  refill rate in micro-units/s (token bucket) or window in ms
-- ARGV[5]  cost in micro-units
-- ARGV[6]  margin added to every key's TTL, in ms
--
-- Returns {allowed (0|1), remaining, retry_after_ms, reset_after_ms, replayed (0|1)}.
--
-- Redis Lua numbers are doubles: integers are exact below 2^53, and the Go
-- side (Limits.Validate) keeps every intermediate value below that. Numbers
-- are formatted with '%.0f' before being written, because Redis would
-- otherwise store them with 14 significant digits.

local function divmod(a, d)
  local q = math.floor(a / d)
  local r = a - q * d
  if r < 0 then
    q = q - 1; r = r + d
  elseif r >= d then
    q = q + 1; r = r - d
  end
  return q, r
end

-- a*m/d rounded down (or up), exact while floor(a/d)*m and (d-1)*m < 2^53.
local function muldiv(a, m, d, up)
  local q, r = divmod(a, d)
  local q2, r2 = divmod(r * m, d)
  local res = q * m + q2
  if up and r2 > 0 then res = res + 1 end
  return res
end

local function int(x) return string.format('%.0f', x) end

local idem_ttl = tonumber(ARGV[2])
local idem_key = nil
if idem_ttl > 0 then
  idem_key = KEYS[#KEYS]
  local prev = redis.call('GET', idem_key)
  if prev then
    local a, r, ra, rs = string.match(prev, '^(%d+):(%d+):(%d+):(%d+)$')
    if a then
      return {tonumber(a), tonumber(r), tonumber(ra), tonumber(rs), 1}
    end
  end
end

local cap = tonumber(ARGV[3])
local param = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local margin = tonumber(ARGV[6])
if cost < 1 or cost > cap then
  return redis.error_reply('ERR cost outside [1, capacity]')
end

-- born is when this store's memory began, from the marker KEYS[2]: 0 for a
-- store the agent found new (Engine.InitStore). A missing marker means the
-- store lost what it held (a restart without persistence), so the first
-- script to notice records that moment. Read only for a missing state key,
-- which then starts as policy.Fresh says.
local function born()
  local b = tonumber(redis.call('GET', KEYS[2]))
  if b == nil then
    b = now
    redis.call('SET', KEYS[2], int(b))
  end
  return b
end

-- young: whether a key missing at now, with limits idle after idle ms, may
-- have been lost while holding less than its full limits (policy.Fresh).
local function young(b, idle) return b > 0 and now - b < idle end

local function finish(allowed, remaining, retry, reset)
  if idem_key then
    redis.call('SET', idem_key,
      int(allowed) .. ':' .. int(remaining) .. ':' .. int(retry) .. ':' .. int(reset),
      'PX', int(idem_ttl))
  end
  return {allowed, remaining, retry, reset, 0}
end
