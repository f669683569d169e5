-- ack: KEYS[1]=P..'members'  ARGV: P, name, ttl_ms, member, upto -> the member's marker
--   forward only: an upto at or below the marker changes nothing (acks are
--   idempotent, as redelivered messages are acked again); past the last id
--   is refused (it would pre-ack messages not sent yet).
local P, name, member, upto = ARGV[1], ARGV[2], ARGV[4], tonumber(ARGV[5])
local pos = redis.call('ZSCORE', P .. 'members', member)
if not pos then refuse(P, name, member) end
pos = tonumber(pos)
local last = tonumber(redis.call('GET', P .. 'seq') or '0')
if upto > last then
  error({err = 'FBQ RANGE cannot ack up to id ' .. fmt(upto) .. ' in inbox ' .. name
               .. ': its last id is ' .. fmt(last)})
end
if upto > pos then
  redis.call('ZADD', P .. 'members', upto, member)
  redis.call('HINCRBY', P .. 'stats', 'ack', upto - pos)
  pos = upto
  trim(P)
end
expire(P, tonumber(ARGV[3]), now_ms())
return pos
