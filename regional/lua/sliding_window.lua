-- sliding_window.lua: sliding window counter; mirrors slidingWindow in slidingwindow.go.
-- Key k: hash {l = last ms, w = window index, p = previous count, c = count};
-- bk the birth marker; w the window in ms; force: count a charge that does
-- not fit too (a policy taking charges after the fact). Returns allowed,
-- remaining (negative: the estimate over the limit), retry ms, reset ms
-- and the time it decided at (now, held to the key's last).

-- smallest x in [lo, w] with ceil(p*(w-x)/w) + c <= room (true at x = w)
local function first_fit(w, lo, p, c, room)
  local hi = w
  while lo < hi do
    local mid = lo + math.floor((hi - lo) / 2)
    if muldiv(p, w - mid, w, true) + c <= room then hi = mid else lo = mid + 1 end
  end
  return lo
end

local function sliding_window(k, bk, now, cap, w, cost, margin, _, force)
  local st = redis.call('HMGET', k, 'l', 'w', 'p', 'c')
  local last, sw, sp, sc = tonumber(st[1]), tonumber(st[2]), tonumber(st[3]), tonumber(st[4])
  local exists = last ~= nil and sw ~= nil and sp ~= nil and sc ~= nil
  if not exists then
    local b = born(bk, now)
    if young(b, now, 2 * w) then -- Holding(born, 0): the window of the loss was used up
      exists = true; last = b; sw = math.floor(b / w); sp = 0; sc = cap
    end
  end
  if exists and now < last then now = last end
  local idx = math.floor(now / w)
  local prev, count = 0, 0
  if exists then
    if sw >= idx then
      idx = sw; prev = sp; count = sc
    elseif sw == idx - 1 then
      prev = sc
    end
  end
  local elapsed = now - idx * w
  local est = muldiv(prev, w - elapsed, w, true) + count

  local allowed, retry = 0, 0
  local fits = est + cost <= cap
  local room = cap - cost -- for the retry: what the window must come down to
  if fits or force then
    local added = math.min(cost, cap + max_debt - count)
    count = count + added
    est = est + added
    room = cap -- counted: a check is the next to fit
  end
  if fits then
    allowed = 1
  elseif count <= room then
    retry = first_fit(w, elapsed + 1, prev, count, room) - elapsed
  else
    retry = w - elapsed + first_fit(w, 0, count, 0, room)
  end
  local remaining = cap - est
  local reset = 0
  if count > 0 then reset = 2 * w - elapsed elseif prev > 0 then reset = w - elapsed end
  redis.call('HSET', k, 'l', int(now), 'w', int(idx), 'p', int(prev), 'c', int(count))
  redis.call('PEXPIRE', k, int(2 * w + margin))
  return allowed, remaining, retry, reset, now
end
