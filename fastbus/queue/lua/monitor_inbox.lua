-- monitor_inbox: KEYS[1]=P..'members'  ARGV: P, limit
--   -> {last id, messages stored, {stats flat}, members, {member, marker,
--       pending, ...} for the `limit` members furthest behind, created ms of
--       the oldest stored message (0: none), now ms}
local P, limit = ARGV[1], tonumber(ARGV[2])
local M, S = P .. 'members', P .. 'msgs'
local flat = redis.call('ZRANGE', M, 0, limit - 1, 'WITHSCORES')
local members = {}
for i = 1, #flat, 2 do
  local pos = tonumber(flat[i + 1])
  members[#members + 1] = flat[i]
  members[#members + 1] = pos
  members[#members + 1] = redis.call('ZCOUNT', S, '(' .. fmt(pos), '+inf')
end
local head = redis.call('ZRANGE', S, 0, 0)[1]
local oldest = 0
if head then oldest = struct.unpack('>I8', head, 10) end
return {tonumber(redis.call('GET', P .. 'seq') or '0'), redis.call('ZCARD', S), redis.call('HGETALL', P .. 'stats'),
        redis.call('ZCARD', M), members, oldest, now_ms()}
