-- sliding_log.lua: exact sliding log; mirrors slidingLog in slidinglog.go.
-- KEYS[1] sorted set of admitted requests, member "<ms>:<seq>:<cost>", score ms;
-- KEYS[3] hash {l = last ms, s = sum of costs, n = sequence}; param = window ms.
local w = param
local st = redis.call('HMGET', KEYS[3], 'l', 's', 'n')
local last, sum, seq = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
if last == nil or sum == nil or seq == nil then
  -- A missing or partial meta hash means the log is gone too: start fresh.
  redis.call('DEL', KEYS[1])
  last = now; sum = 0; seq = 0
  local b = born()
  if young(b, w) then -- Holding(born, 0): the whole limit used at the loss
    redis.call('ZADD', KEYS[1], int(b), int(b) .. ':0:' .. int(cap))
    last = b; sum = cap
  end
end
if now < last then now = last end

local function entry_cost(member)
  return tonumber(string.match(member, ':(%d+)$'))
end

local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now - w))
for i = 1, #gone do sum = sum - entry_cost(gone[i]) end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now - w)) end

local allowed, retry = 0, 0
if sum + cost <= cap then
  seq = seq + 1
  redis.call('ZADD', KEYS[1], int(now), int(now) .. ':' .. int(seq) .. ':' .. int(cost))
  sum = sum + cost
  allowed = 1
else
  local free = sum
  local kept = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #kept, 2 do
    free = free - entry_cost(kept[i])
    if free + cost <= cap then
      retry = tonumber(kept[i + 1]) + w - now
      break
    end
  end
end
local remaining = cap - sum
if remaining < 0 then remaining = 0 end
local reset = 0
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest > 0 then reset = tonumber(newest[2]) + w - now end
redis.call('HSET', KEYS[3], 'l', int(now), 's', int(sum), 'n', int(seq))
redis.call('PEXPIRE', KEYS[1], int(w + margin))
redis.call('PEXPIRE', KEYS[3], int(w + margin))
return finish(allowed, remaining, retry, reset)
