-- return_failed: KEYS[1]=P..'ready'  ARGV: P, n (0 = all), B, ttl_ms  -> how many
--   the oldest failed items back to the tail of ready, delivery count reset.
--   A topic consumer's failed item carries its body (see to_failed): the body
--   goes back into its block (made again, with the topic's TTL, if it
--   expired), taking a reference, and the header alone to ready.
local P, n, B, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local items
if n > 0 then items = redis.call('LPOP', P .. 'failed', n) else
  items = redis.call('LRANGE', P .. 'failed', 0, -1)
  redis.call('DEL', P .. 'failed')
end
if not items then return 0 end
for i, item in ipairs(items) do
  if B ~= '' then
    local blk = block_of(id_of(item))
    local bk = bkey(B, blk)
    local gone = redis.call('EXISTS', bk) == 0
    -- field = the id's 8 bytes, value = created ms .. payload (header bytes
    -- 14..21, then the body).  HSETNX: a body still in its block is the
    -- same message; other consumers may still read it there.
    redis.call('HSETNX', bk, string.sub(item, 6, 13), string.sub(item, 14))
    if gone then
      redis.call('PEXPIRE', bk, ttl)
      redis.call('ZADD', B .. 'blocks', blk, fmt(blk))
    end
    redis.call('HINCRBY', B .. 'refs', fmt(blk), 1)
    item = string.sub(item, 1, 21)
  end
  items[i] = with_prior(item, 0)
end
call_many('RPUSH', P .. 'ready', items, 1000)
wake(P)
return #items
