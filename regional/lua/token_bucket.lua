-- token_bucket.lua: the token bucket; mirrors tokenBucket in tokenbucket.go.
-- Key k: hash {t = tokens, l = last ms}; bk the birth marker; rate in
-- micro-units/s; force: count a charge that does not fit too (a policy
-- taking charges after the fact), into debt. Returns allowed (0|1),
-- remaining (negative: the debt), retry ms, reset ms and the time it
-- decided at (now, held to the key's last).
local function token_bucket(k, bk, now, cap, rate, cost, margin, _, force)
  local st = redis.call('HMGET', k, 't', 'l')
  local tokens, last = tonumber(st[1]), tonumber(st[2])
  if tokens == nil or last == nil then
    local b = born(bk, now)
    if young(b, now, muldiv(cap, 1000, rate, true)) then
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
  local fits = cost <= tokens
  if fits then
    allowed = 1
  else
    retry = muldiv(cost - tokens, 1000, rate, true)
  end
  if fits or force then tokens = math.max(tokens - cost, -max_debt) end
  local reset = muldiv(cap - tokens, 1000, rate, true)
  redis.call('HSET', k, 't', int(tokens), 'l', int(now))
  -- until full again, debt included (policy.Limits.IdleAfter): expiring
  -- sooner would forgive the debt
  redis.call('PEXPIRE', k, int(muldiv(cap - math.min(tokens, 0), 1000, rate, true) + margin))
  return allowed, tokens, retry, reset, now
end
