-- stats: KEYS[1]=P..'ready'  ARGV: P, seconds of rate buckets
--   -> {ready, failed, {stats hash flat}, {tag, unacked, hb pttl, ...}, now_s, {second, {bucket flat}, ...}, now_us}
local P, secs = ARGV[1], tonumber(ARGV[2])
local consumers = {}
for _, tag in ipairs(redis.call('SMEMBERS', P .. 'consumers')) do
  consumers[#consumers + 1] = tag
  consumers[#consumers + 1] = redis.call('HLEN', P .. 'unacked:' .. tag)
  consumers[#consumers + 1] = redis.call('PTTL', P .. 'hb:' .. tag)
end
local t = redis.call('TIME')
local now = tonumber(t[1])
local buckets = {}
for s = now - secs, now do
  buckets[#buckets + 1] = s
  buckets[#buckets + 1] = redis.call('HGETALL', P .. 'rate:' .. s)
end
return {redis.call('LLEN', P .. 'ready'), redis.call('LLEN', P .. 'failed'),
        redis.call('HGETALL', P .. 'stats'), consumers, now, buckets, tonumber(t[2])}
