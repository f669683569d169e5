-- monitor_topic: KEYS[1]=T..'seq'  ARGV: T
--   -> {last id, {stats flat}, body blocks, {name, space(consumer's P), ...}, now ms}
local T = ARGV[1]
local cs = {}
for _, name in ipairs(redis.call('SMEMBERS', T .. 'consumers')) do
  cs[#cs + 1] = name
  cs[#cs + 1] = space(T .. 'c:' .. name .. ':')
end
return {tonumber(redis.call('GET', T .. 'seq') or '0'), redis.call('HGETALL', T .. 'stats'),
        redis.call('ZCARD', T .. 'blocks'), cs, now_ms()}
