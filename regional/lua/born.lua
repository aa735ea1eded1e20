-- born.lua (after now.lua): read the birth marker KEYS[1], recording now
-- in it when it is missing, as the first decision script to find it
-- missing would (see born in prelude.lua). Returns the marker.
local b = redis.call('GET', KEYS[1])
if b then return tonumber(b) end
redis.call('SET', KEYS[1], string.format('%.0f', now))
return now
