-- fixed_window.lua: aligned fixed windows; mirrors fixedWindow in fixedwindow.go.
-- Key k: hash {l = last ms, w = window index, c = count}; bk the birth
-- marker; w the window in ms. Returns allowed, remaining, retry ms, reset ms.
local function fixed_window(k, bk, now, cap, w, cost, margin)
  local st = redis.call('HMGET', k, 'l', 'w', 'c')
  local last, sw, sc = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  local exists = last ~= nil and sw ~= nil and sc ~= nil
  if not exists then
    local b = born(bk, now)
    if young(b, now, w) then -- Holding(born, 0): the window of the loss was used up
      exists = true; last = b; sw = math.floor(b / w); sc = cap
    end
  end
  if exists and now < last then now = last end
  local idx = math.floor(now / w)
  local count = 0
  if exists and sw >= idx then
    idx = sw; count = sc
  end
  local window_end = (idx + 1) * w
  local allowed, retry = 0, 0
  if count + cost <= cap then
    count = count + cost
    allowed = 1
  else
    retry = window_end - now
  end
  local remaining = cap - count
  if remaining < 0 then remaining = 0 end
  redis.call('HSET', k, 'l', int(now), 'w', int(idx), 'c', int(count))
  redis.call('PEXPIRE', k, int(w + margin))
  return allowed, remaining, retry, window_end - now
end
