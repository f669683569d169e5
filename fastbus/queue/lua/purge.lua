-- purge: KEYS[1]=P..'ready'  ARGV: P, which ('ready' or 'failed'), B -> how many
local P, which, B = ARGV[1], ARGV[2], ARGV[3]
local items = redis.call('LRANGE', P .. which, 0, -1)
if B ~= '' and which == 'ready' then unref(B, items) end
redis.call('DEL', P .. which)
if which == 'ready' then redis.call('DEL', P .. 'notify') end
return #items
