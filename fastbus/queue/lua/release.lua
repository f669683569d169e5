-- release: KEYS[1]=P..'ready'  ARGV: P, tag, token, B  -> {returned, 0}
--   a consumer's graceful close: its unacked items back to ready, uncounted
local P, tag, token, B = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('GET', P .. 'hb:' .. tag)
if cur == GONE then redis.call('DEL', P .. 'hb:' .. tag) end   -- the instance learnt it is gone
if cur and cur ~= token then return {0, 0} end
return {release(P, B, tag, false, 0)}
