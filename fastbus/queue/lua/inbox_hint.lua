-- hint: KEYS[1]=prefix:u:{member}:inboxes  (ZSET inbox name -> version)
--   ARGV 'add', inbox        -> the version now held (a new one, > any before)
--   ARGV 'drop', inbox, v    -> 1 removed, 0 left: only if its version is still v
--   ARGV 'list'              -> {inbox, version, ...}
-- Versions are server microseconds, and above the highest in the set: a
-- hint removed and added again never gets back a version someone may hold,
-- so a conditional drop cannot remove a hint added after it looked.
local U, op = KEYS[1], ARGV[1]
if op == 'add' then
  local t = redis.call('TIME')
  local v = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local top = redis.call('ZRANGE', U, -1, -1, 'WITHSCORES')[2]
  if top and tonumber(top) >= v then v = tonumber(top) + 1 end
  redis.call('ZADD', U, v, ARGV[2])
  return v
elseif op == 'drop' then
  if tonumber(redis.call('ZSCORE', U, ARGV[2]) or '-1') == tonumber(ARGV[3]) then
    return redis.call('ZREM', U, ARGV[2])
  end
  return 0
end
local flat = redis.call('ZRANGE', U, 0, -1, 'WITHSCORES')
for i = 2, #flat, 2 do flat[i] = tonumber(flat[i]) end
return flat
