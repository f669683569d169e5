-- position: KEYS[1]=T..'seq'  ARGV: T, name -> the consumer's position: the
--   last id it acked up to (or was registered at); -1: no such consumer.
--   Consumers registered before positions were kept: the id before their
--   oldest pending message, else the last id.
local T, name = ARGV[1], ARGV[2]
if redis.call('SISMEMBER', T .. 'consumers', name) == 0 then return -1 end
local P = T .. 'c:' .. name .. ':'
local pos = redis.call('GET', P .. 'pos')
if pos then return tonumber(pos) end
local head = redis.call('LINDEX', P .. 'ready', 0)
if head then return id_of(head) - 1 end
return tonumber(redis.call('GET', T .. 'seq') or '0')
