-- commit_staged: KEYS[1]=a key of the target's slot
--   ARGV: kind ('t' topic, 'q' work queue, 'c' channel), target (T, P or the
--         channel), ttl_ms (topics), S (the sink's state hash), batch id,
--         n (rows per call), staged list keys in row order...
--   -> {rows published by this call, 1 when the batch is done}
--   S holds done (the last batch fully published) and, while one is half
--   published, batch and pos (rows of it published so far, in row order).
--   A batch at or below done publishes nothing (a replay); a batch whose
--   commit died half way (batch = this one) goes on from pos, skipping the
--   rows of its staged lists (a replayed batch has the same rows) that went.
local kind, target, ttl, S, batch, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local staged = {}
for i = 7, #ARGV do staged[#staged + 1] = ARGV[i] end
local st = redis.call('HMGET', S, 'done', 'batch', 'pos')
local function finish()
  for i = 1, #staged, 1000 do redis.call('DEL', unpack(staged, i, math.min(i + 999, #staged))) end
end
if st[1] and tonumber(st[1]) >= batch then finish() return {0, 1} end
local pos = 0
if st[2] and tonumber(st[2]) == batch then pos = tonumber(st[3]) end
local rows, skip = {}, pos
for _, key in ipairs(staged) do
  if #rows >= n then break end
  local len = redis.call('LLEN', key)
  if skip >= len then skip = skip - len else
    for _, v in ipairs(redis.call('LRANGE', key, skip, skip + n - #rows - 1)) do rows[#rows + 1] = v end
    skip = 0
  end
end
if #rows > 0 then
  if kind == 't' then
    for i = 1, #rows, 1000 do publish(target, ttl, {unpack(rows, i, math.min(i + 999, #rows))}) end
  elseif kind == 'q' then
    for i = 1, #rows, 1000 do put(target, {unpack(rows, i, math.min(i + 999, #rows))}) end
  else
    for _, v in ipairs(rows) do redis.call('PUBLISH', target, v) end
  end
end
if #rows < n then
  redis.call('HSET', S, 'done', batch)
  redis.call('HDEL', S, 'batch', 'pos')
  finish()
  return {#rows, 1}
end
redis.call('HSET', S, 'batch', batch, 'pos', pos + #rows)
return {#rows, 0}
