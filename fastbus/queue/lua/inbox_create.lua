-- create: KEYS[1]=P..'members'  ARGV: P, name, ttl_ms, has_message ('1'/'0'), sender, payload, member...
--   -> {1, id of the first message or 0}, or, if the inbox exists already,
--      {0, {1 if ARGV member i is a member of it else 0, ...}} (the caller
--      then withdraws the hints it added for the others)
local P = ARGV[1]
local M = P .. 'members'
if redis.call('EXISTS', M) == 1 then
  local flags = {}
  for i = 7, #ARGV do flags[#flags + 1] = redis.call('ZSCORE', M, ARGV[i]) and 1 or 0 end
  return {0, flags}
end
-- seq is gone with the last member (see INBOX_LEAVE), so this is 0 unless
-- keys were left behind by hand; starting from it keeps ids from repeating.
local last = tonumber(redis.call('GET', P .. 'seq') or '0')
local args = {}
for i = 7, #ARGV do
  args[#args + 1] = last
  args[#args + 1] = ARGV[i]
end
call_many('ZADD', M, args, 1000)        -- 1000: even, so (score, member) pairs stay whole
if ARGV[4] == '1' then return {1, store(P, ARGV[5], ARGV[6], tonumber(ARGV[3]))} end
return {1, 0}
