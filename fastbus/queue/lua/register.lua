-- register: KEYS[1]=P..'ready'  ARGV: P, tag, token, ttl_ms, B, max
--   -> {returned, dead}: what a previous consumer with this tag left unacked;
--   GONE_REPLY: B is a topic and P's logical consumer is not registered.
--   It writes first with PEXPIRE, which Redis allows when the server is out
--   of memory (and then no later write of the script is refused): a consumer
--   must be able to start and drain a queue whose server is full.
local P, tag, token, ttl, B, max = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
if B ~= '' and not registered(B, P) then return GONE_REPLY end
local hb = P .. 'hb:' .. tag
local cur = redis.call('GET', hb)
if cur == token then
  redis.call('PEXPIRE', hb, ttl)
  return {0, 0}
elseif cur and cur ~= GONE then
  error({err = 'FBQ TAKEN consumer tag ' .. tag .. ' is held by another live consumer'})
end
redis.call('PEXPIRE', hb, ttl)
redis.call('SET', hb, token, 'PX', ttl)
local back, dead = 0, 0
if redis.call('EXISTS', P .. 'unacked:' .. tag) == 1 then
  back, dead = release(P, B, tag, true, max)
  redis.call('SET', hb, token, 'PX', ttl)
end
redis.call('SADD', P .. 'consumers', tag)
redis.call('HSET', P .. 'beats', tag, now_ms())
return {back, dead}
