-- retained: KEYS[1]=T..'seq'  ARGV: T -> {first retained id (0: none), last id}
--   the oldest block that still exists (entries of expired blocks pruned, at
--   most 1000 a call, so a long-idle topic cannot stall the server: -1 then
--   means "call again")
local T = ARGV[1]
local last = tonumber(redis.call('GET', T .. 'seq') or '0')
for _ = 1, 1000 do
  local head = redis.call('ZRANGE', T .. 'blocks', 0, 0)
  if #head == 0 then return {0, last} end
  local ids = redis.call('HKEYS', bkey(T, tonumber(head[1])))
  if #ids > 0 then
    local low = ids[1]
    for _, f in ipairs(ids) do if f < low then low = f end end
    return {struct.unpack('>I8', low), last}
  end
  redis.call('ZREM', T .. 'blocks', head[1])
end
return {-1, last}
