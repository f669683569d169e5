-- settle: KEYS[1]=P..'ready'
--   ARGV: P, tag, token, ttl_ms, B, max, then three strings of 8-byte ids
--         joined: to ack, to reject, to requeue (one argument each: a
--         thousand ids cost the client one argument, not a thousand)
--   -> {acked, rejected, requeued, dead, {positions (1-based, acks first) not held}};
--   GONE_REPLY (see beat)
local P, tag, token, ttl, B, max = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
if not beat(P, B, tag, token, ttl, false) then return GONE_REPLY end
local u = P .. 'unacked:' .. tag
local function split(s)
  local t = {}
  for i = 1, #s, 8 do t[#t + 1] = string.sub(s, i, i + 7) end
  return t
end
local acks, rejects, requeues = split(ARGV[7]), split(ARGV[8]), split(ARGV[9])
local acked, rejected, missing, again = 0, 0, {}, {}
-- acks, the common case, in bulk: which are held (HMGET), then one HDEL
for i = 1, #acks, 1000 do
  local chunk = {unpack(acks, i, math.min(i + 999, #acks))}
  local held = redis.call('HMGET', u, unpack(chunk))
  local del = {}
  for j = 1, #chunk do
    if held[j] then
      del[#del + 1] = chunk[j]
    else
      missing[#missing + 1] = i + j - 1
    end
  end
  if #del > 0 then redis.call('HDEL', u, unpack(del)) end
  if B ~= '' then unref(B, del, 1) end
  acked = acked + #del
end
local function take(list, base, each)
  for k, id in ipairs(list) do
    local item = redis.call('HGET', u, id)
    if item then
      redis.call('HDEL', u, id)
      each(item)
    else
      missing[#missing + 1] = base + k
    end
  end
end
local failed = {}
take(rejects, #acks, function(item) failed[#failed + 1] = with_prior(item, struct.unpack('>I4', item, 2) + 1) end)
to_failed(P, B, failed)
rejected = #failed
take(requeues, #acks + #rejects, function(item) again[#again + 1] = item end)
local requeued, dead = give_back(P, B, again, true, max)
count(P, 'ack', acked)
count(P, 'reject', rejected)
count(P, 'requeue', requeued)
count(P, 'dead', dead)
return {acked, rejected, requeued, dead, missing}
