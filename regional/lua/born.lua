-- born.lua: read the birth marker KEYS[1], recording the present moment in
-- it when it is missing, as the first decision script to find it missing
-- would (see born in prelude.lua). ARGV[1] is now in ms, or '' for the
-- Redis server clock. Returns the marker.
local b = redis.call('GET', KEYS[1])
if b then return tonumber(b) end
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
redis.call('SET', KEYS[1], string.format('%.0f', now))
return now
