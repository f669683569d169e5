-- heartbeat: KEYS[1]=P..'ready'  ARGV: P, tag, token, ttl_ms, B -> 1; GONE_REPLY (see beat)
--   the time of the beat goes to P..'beats' (what a monitor shows as the last heartbeat)
if not beat(ARGV[1], ARGV[5], ARGV[2], ARGV[3], tonumber(ARGV[4]), true) then return GONE_REPLY end
redis.call('HSET', ARGV[1] .. 'beats', ARGV[2], now_ms())
return 1
