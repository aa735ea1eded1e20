-- sliding_log.lua: exact sliding log; mirrors slidingLog in slidinglog.go.
-- Key k: sorted set of admitted requests, member "<ms>:<seq>:<cost>", score
-- ms; mk: hash {l = last ms, s = sum of costs, n = sequence}; bk the birth
-- marker; w the window in ms; force: log a charge that does not fit too (a
-- policy taking charges after the fact), the newest entry taken into it
-- when the log is full (max_log entries). Returns allowed, remaining
-- (negative: the sum over the limit), retry ms, reset ms and the time it
-- decided at (now, held to the key's last).
local max_log = 10000 -- policy.MaxLogEntries

local function entry_cost(member)
  return tonumber(string.match(member, ':(%d+)$'))
end

local function sliding_log(k, bk, now, cap, w, cost, margin, mk, force)
  local st = redis.call('HMGET', mk, 'l', 's', 'n')
  local last, sum, seq = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  if last == nil or sum == nil or seq == nil then
    -- A missing or partial meta hash means the log is gone too: start fresh.
    redis.call('DEL', k)
    last = now; sum = 0; seq = 0
    local b = born(bk, now)
    if young(b, now, w) then -- Holding(born, 0): the whole limit used at the loss
      redis.call('ZADD', k, int(b), int(b) .. ':0:' .. int(cap))
      last = b; sum = cap
    end
  end
  if now < last then now = last end

  local gone = redis.call('ZRANGEBYSCORE', k, '-inf', int(now - w))
  for i = 1, #gone do sum = sum - entry_cost(gone[i]) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', k, '-inf', int(now - w)) end

  local allowed, retry = 0, 0
  local fits = sum + cost <= cap
  local owed = cost -- what must still fit for the retry: nothing once logged
  if (fits or force) and cost > 0 then -- a charge of 0 (a check, returns.lua bringing the log to now) logs nothing
    local c = math.min(cost, cap + max_debt - sum)
    sum = sum + c
    if force and redis.call('ZCARD', k) >= max_log then
      local newest = redis.call('ZRANGE', k, -1, -1)
      redis.call('ZREM', k, newest[1])
      c = c + entry_cost(newest[1])
    end
    seq = seq + 1
    redis.call('ZADD', k, int(now), int(now) .. ':' .. int(seq) .. ':' .. int(c))
    owed = 0
  end
  if fits then
    allowed = 1
  else
    -- The retry is when enough of the oldest entries have left the window.
    -- Read them oldest first, in pages that double, so a rejection reads
    -- the entries it needs rather than the whole log.
    local free, from, page, found = sum, 0, 16, false
    while not found do
      local kept = redis.call('ZRANGE', k, from, from + page - 1, 'WITHSCORES')
      if #kept == 0 then break end
      for i = 1, #kept, 2 do
        free = free - entry_cost(kept[i])
        if free + owed <= cap then
          retry = tonumber(kept[i + 1]) + w - now
          found = true
          break
        end
      end
      from, page = from + page, page * 2
    end
  end
  local remaining = cap - sum
  local reset = 0
  local newest = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
  if #newest > 0 then reset = tonumber(newest[2]) + w - now end
  redis.call('HSET', mk, 'l', int(now), 's', int(sum), 'n', int(seq))
  redis.call('PEXPIRE', k, int(w + margin))
  redis.call('PEXPIRE', mk, int(w + margin))
  return allowed, remaining, retry, reset, now
end
