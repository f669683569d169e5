-- subscribe: KEYS[1]=T..'seq'  ARGV: T, name -> {new (1/0), last id}
local T, name = ARGV[1], ARGV[2]
local new = redis.call('SADD', T .. 'consumers', name)
local last = tonumber(redis.call('GET', T .. 'seq') or '0')
if new == 1 then redis.call('SET', T .. 'c:' .. name .. ':pos', last) end
return {new, last}
