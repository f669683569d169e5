-- ack1: KEYS[1]=P..'ready'  ARGV: P, tag, token, ttl_ms, B, id (8 bytes)
--   -> as SETTLE with one ack
local P, tag, token, ttl, B, id = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6]
if not beat(P, B, tag, token, ttl, false) then return GONE_REPLY end
if redis.call('HDEL', P .. 'unacked:' .. tag, id) == 0 then return {0, 0, 0, 0, {1}} end
if B ~= '' then unref1(B, id) end
count(P, 'ack', 1)
return {1, 0, 0, 0, {}}
