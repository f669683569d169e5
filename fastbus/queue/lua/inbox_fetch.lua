-- fetch: KEYS[1]=P..'members'  ARGV: P, name, ttl_ms, member, count, strict ('1'/'0')
--   -> {marker, {packed...}}: up to count messages after the member's marker,
--   which does not move (ack moves it).  Not a member: an error if strict,
--   else {-1, {}} (fetch_all_pending: a stale hint).
local P, name, member = ARGV[1], ARGV[2], ARGV[4]
local pos = redis.call('ZSCORE', P .. 'members', member)
if not pos then
  if ARGV[6] == '1' then refuse(P, name, member) end
  return {-1, {}}
end
pos = tonumber(pos)
expire(P, tonumber(ARGV[3]), now_ms())
return {pos, redis.call('ZRANGEBYSCORE', P .. 'msgs', '(' .. fmt(pos), '+inf', 'LIMIT', 0, tonumber(ARGV[5]))}
