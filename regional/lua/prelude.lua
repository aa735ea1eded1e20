-- prelude.lua: the helpers every algorithm uses (see regional/script.go).
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

-- max_debt is the most a key may be over its limit (policy.MaxDebt): a
-- charge after the fact that would take it further counts up to it.
local max_debt = 2000000000000000

-- born is when this store's memory began, from the marker key bk: 0 for a
-- store the agent found new (Engine.InitStore). A missing marker means the
-- store lost what it held (a restart without persistence), so the first
-- script to notice records that moment. Read only for a missing state key,
-- which then starts as policy.Fresh says.
local function born(bk, now)
  local b = tonumber(redis.call('GET', bk))
  if b == nil then
    b = now
    redis.call('SET', bk, int(b))
  end
  return b
end

-- young: whether a key missing at now, with limits idle after idle ms, may
-- have been lost while holding less than its full limits (policy.Fresh).
local function young(b, now, idle) return b > 0 and now - b < idle end
