-- members: KEYS[1]=P..'members'  ARGV: P -> {member, marker, ...} (markers as
--   integers whatever the client's protocol: RESP3 would give ZRANGE pairs of doubles)
local flat = redis.call('ZRANGE', ARGV[1] .. 'members', 0, -1, 'WITHSCORES')
for i = 2, #flat, 2 do flat[i] = tonumber(flat[i]) end
return flat
