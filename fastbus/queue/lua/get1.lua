-- get1: KEYS[1]=P..'ready'  ARGV: P, tag, token, ttl_ms, B, woke -> as GET with n = 1
local P, tag, token, ttl, B = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
if not beat(P, B, tag, token, ttl, false) then return GONE_REPLY end
local item = redis.call('LPOP', P .. 'ready')
if not item then
  redis.call('DEL', P .. 'notify')      -- ready is empty
  return {}
end
local id = string.sub(item, 6, 13)
redis.call('HSET', P .. 'unacked:' .. tag, id, item)
if ARGV[6] == '1' then wake(P) end      -- we took the token; maybe more: pass it on
count(P, 'get', 1)
if B == '' then return {item} end
local b = body1(B, id)
if b then return {item .. b} end
redis.call('HDEL', P .. 'unacked:' .. tag, id)   -- its body expired: dropped, counted
unref1(B, id)
count(P, 'expired', 1)
return {}
