-- token_bucket.lua: the token bucket; mirrors tokenBucket in tokenbucket.go.
-- KEYS[1] hash {t = tokens, l = last ms}; param = rate (micro-units/s).
local rate = param
local st = redis.call('HMGET', KEYS[1], 't', 'l')
local tokens, last = tonumber(st[1]), tonumber(st[2])
if tokens == nil or last == nil then
  local b = born()
  if young(b, muldiv(cap, 1000, rate, true)) then
    tokens = 0; last = b -- Holding(born, 0): refills from empty since the loss
  else
    tokens = cap; last = now
  end
end
if now < last then now = last end
if tokens > cap then tokens = cap end
local missing, elapsed = cap - tokens, now - last
if missing > 0 and elapsed > 0 then
  if elapsed >= muldiv(missing, 1000, rate, true) then
    tokens = cap
  else
    tokens = tokens + muldiv(elapsed, rate, 1000, false)
  end
end
local allowed, retry = 0, 0
if cost <= tokens then
  tokens = tokens - cost
  allowed = 1
else
  retry = muldiv(cost - tokens, 1000, rate, true)
end
local reset = muldiv(cap - tokens, 1000, rate, true)
redis.call('HSET', KEYS[1], 't', int(tokens), 'l', int(now))
redis.call('PEXPIRE', KEYS[1], int(muldiv(cap, 1000, rate, true) + margin))
return finish(allowed, tokens, retry, reset)
