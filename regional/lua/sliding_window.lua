-- sliding_window.lua: sliding window counter; mirrors slidingWindow in slidingwindow.go.
-- Key k: hash {l = last ms, w = window index, p = previous count, c = count};
-- bk the birth marker; w the window in ms. Returns allowed, remaining,
-- retry ms, reset ms.

-- smallest x in [lo, w] with ceil(p*(w-x)/w) + c <= room (true at x = w)
local function first_fit(w, lo, p, c, room)
  local hi = w
  while lo < hi do
    local mid = lo + math.floor((hi - lo) / 2)
    if muldiv(p, w - mid, w, true) + c <= room then hi = mid else lo = mid + 1 end
  end
  return lo
end

local function sliding_window(k, bk, now, cap, w, cost, margin)
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
  if est + cost <= cap then
    count = count + cost
    est = est + cost
    allowed = 1
  else
    local room = cap - cost
    if count <= room then
      retry = first_fit(w, elapsed + 1, prev, count, room) - elapsed
    else
      retry = w - elapsed + first_fit(w, 0, count, 0, room)
    end
  end
  local remaining = cap - est
  if remaining < 0 then remaining = 0 end
  local reset = 0
  if count > 0 then reset = 2 * w - elapsed elseif prev > 0 then reset = w - elapsed end
  redis.call('HSET', k, 'l', int(now), 'w', int(idx), 'p', int(prev), 'c', int(count))
  redis.call('PEXPIRE', k, int(2 * w + margin))
  return allowed, remaining, retry, reset
end
