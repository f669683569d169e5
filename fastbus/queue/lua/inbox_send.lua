-- send: KEYS[1]=P..'members'  ARGV: P, name, ttl_ms, sender, payload -> id
local P, name, sender = ARGV[1], ARGV[2], ARGV[4]
if not redis.call('ZSCORE', P .. 'members', sender) then refuse(P, name, sender) end
return store(P, sender, ARGV[5], tonumber(ARGV[3]))
