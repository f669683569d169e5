-- topic_info: KEYS[1]=T..'seq'  ARGV: T -> {last id, {names}, {stats flat}}
local T = ARGV[1]
return {tonumber(redis.call('GET', T .. 'seq') or '0'), redis.call('SMEMBERS', T .. 'consumers'),
        redis.call('HGETALL', T .. 'stats')}
