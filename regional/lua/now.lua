-- now.lua: the head of every script (see regional/script.go): now is
-- ARGV[1] in ms, or the Redis server clock (TIME) when ARGV[1] is ''.
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
