-- resolve: KEYS[1]=a key of the namespace  ARGV: P (or T), mark...
--   -> per mark, the first id its call wrote, or 0: it wrote nothing and
--   never will (fenced).  It must run when the server is out of memory,
--   which is when a batch fails: its first write is a DEL, which Redis
--   allows then, and after a first write a script is not refused any more.
local P = ARGV[1]
redis.call('DEL', P .. 'w:')
local out = {}
for i = 2, #ARGV do
  local k = P .. 'w:' .. ARGV[i]
  if redis.call('SET', k, '0', 'NX', 'PX', MARK_TTL) then out[#out + 1] = 0
  else out[#out + 1] = tonumber(redis.call('GET', k)) end
end
return out
