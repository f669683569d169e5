-- join: KEYS[1]=P..'members'  ARGV: P, member, create ('1'/'0')
--   -> {1, marker} joined now (at the last id), {0, marker} a member already,
--      {-1, 0} no such inbox (and create is '0')
local P, member = ARGV[1], ARGV[2]
local M = P .. 'members'
local pos = redis.call('ZSCORE', M, member)
if pos then return {0, tonumber(pos)} end
if ARGV[3] ~= '1' and redis.call('EXISTS', M) == 0 then return {-1, 0} end
-- reading the counter and adding the member are one step: no message can be
-- given an id between them, and no leave can delete the counter between them
local last = tonumber(redis.call('GET', P .. 'seq') or '0')
redis.call('ZADD', M, last, member)
return {1, last}
