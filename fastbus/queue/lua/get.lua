-- get: KEYS[1]=P..'ready'  ARGV: P, tag, token, ttl_ms, n, B, woke ('1':
--   after a BLPOP that may have taken the wake token)
--   -> items (with bodies); GONE_REPLY (see beat).  GET1 for n = 1.
local P, tag, token, ttl, n, B = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
if not beat(P, B, tag, token, ttl, false) then return GONE_REPLY end
local u = P .. 'unacked:' .. tag
local items = redis.call('LPOP', P .. 'ready', n)
if not items then
  redis.call('DEL', P .. 'notify')      -- ready is empty
  return {}
end
local fields = {}
for i, item in ipairs(items) do
  fields[2 * i - 1] = string.sub(item, 6, 13)
  fields[2 * i] = item
end
call_many('HSET', u, fields, 1000)
if #items < n then
  redis.call('DEL', P .. 'notify')      -- ready is empty now
elseif ARGV[7] == '1' then
  wake(P)                               -- we took the token; maybe more: pass it on
end
count(P, 'get', #items)
if B == '' then return items end
local out, expired, gone = {}, {}, {}
for i, b in ipairs(bodies(B, items)) do
  if b then out[#out + 1] = items[i] .. b else
    expired[#expired + 1] = string.sub(items[i], 6, 13)
    gone[#gone + 1] = items[i]
  end
end
if #expired > 0 then
  call_many('HDEL', u, expired, 1000)
  unref(B, gone)
  count(P, 'expired', #expired)
end
return out
