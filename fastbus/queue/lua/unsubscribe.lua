-- unsubscribe: KEYS[1]=T..'seq'  ARGV: T, name -> pending items dropped
--   every item it still had (ready or unacked) releases its body reference
local T, name = ARGV[1], ARGV[2]
local P, B = T .. 'c:' .. name .. ':', T
if redis.call('SREM', T .. 'consumers', name) == 0 then return -1 end
local dropped = 0
local function drop(items)
  unref(B, items)
  dropped = dropped + #items
end
drop(redis.call('LRANGE', P .. 'ready', 0, -1))
local keys = {P .. 'ready', P .. 'failed', P .. 'stats', P .. 'notify', P .. 'consumers', P .. 'pos', P .. 'beats'}
for _, tag in ipairs(redis.call('SMEMBERS', P .. 'consumers')) do
  drop(redis.call('HVALS', P .. 'unacked:' .. tag))
  keys[#keys + 1] = P .. 'unacked:' .. tag
  -- a live instance finds GONE at its next call (see beat) and stops; the
  -- mark goes with the instance's close, or when its heartbeat would have expired
  local hb = P .. 'hb:' .. tag
  local left = redis.call('PTTL', hb)
  if left > 0 then redis.call('SET', hb, GONE, 'PX', left) else keys[#keys + 1] = hb end
end
local now = tonumber(redis.call('TIME')[1])
for sec = now - 121, now do keys[#keys + 1] = P .. 'rate:' .. sec end   -- they would expire anyway
call_many('DEL', keys[1], {unpack(keys, 2)}, 1000)
return dropped
