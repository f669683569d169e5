-- lib.lua: the functions the queue scripts share (work queues, topics,
-- staged writers; inbox_lib.lua and monitor_lib.lua add their own).  The
-- loader (fastbus/queue/_lua.py) gives each script only the paragraphs of its
-- libraries that it uses, directly or through one another: Lua runs a
-- script's whole text on every call, so every function defined there costs a
-- closure per call, used or not.  A file's leading comment lines (this
-- header) are not sent to the server.
--
-- Every operation that touches more than one key is one script, so a client
-- that dies between two commands cannot leave a message in two places or in
-- none.  The scripts derive the keys of a queue from its namespace P (passed
-- in ARGV; KEYS[1] is a key of the same namespace, so that Redis Cluster
-- clients route the call to the right node): every key of one queue, topic or
-- inbox starts with the same prefix:kind:{name}: and so shares a hash slot.
--
-- A work-queue item is a 21-byte header and the payload:
--
--     version  u8   = 1
--     prior    u32  deliveries so far (0 when put; a consumer's get is delivery prior + 1)
--     id       u64  from INCRBY on P..'seq' (monotonic per queue)
--     created  u64  server time in milliseconds (TIME), when put
--     payload  ...  (empty in a topic consumer's lists: the body is kept once,
--                   in the topic's block hash m:<id // 1024>)
--
-- all big-endian, so bytes 6..13 (the id) compare like the numbers and serve
-- as the field name of the unacked hashes.
--
-- Keys of a queue namespace P:
--     ready           list of items, taken from the head
--     failed          list of items (the dead-letter list)
--     seq             the last id given
--     stats           hash of running totals: put get ack reject requeue dead returned expired
--     rate:<second>   hash, the same counters per second of server time (expire after 120 s)
--     notify          list of at most one token: wakes one blocked consumer
--     consumers       set of consumer tags that may hold unacked items
--     hb:<tag>        the consumer's heartbeat: its token, with a TTL
--     beats           hash tag -> server time (ms) of the consumer's last heartbeat
--                     (registration or HEARTBEAT; for monitoring); removed with the consumer
--     unacked:<tag>   hash id(8 bytes) -> item, what the consumer holds

-- Every redis.call costs a few microseconds of fixed overhead (more than
-- most of the commands themselves): the scripts make as few as they can,
-- e.g. one TIME per script.
local NOW
local function now()
  if not NOW then NOW = redis.call('TIME') end
  return NOW
end

local function now_ms()
  local t = now()
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n) return string.format('%.0f', n) end

-- running totals and the bucket of the current second
local function count(P, field, n)
  if n == 0 then return end
  redis.call('HINCRBY', P .. 'stats', field, n)
  local k = P .. 'rate:' .. now()[1]
  if redis.call('HINCRBY', k, field, n) == n then redis.call('EXPIRE', k, 120) end
end

-- one call per at most 1000 arguments (Lua's unpack has a stack limit)
-- -> the last call's reply (RPUSH, LPUSH: the list's length)
local function call_many(cmd, key, args, step)
  local r
  for i = 1, #args, step do
    r = redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
  return r
end

local function id_of(item) return struct.unpack('>I8', item, 6) end

local function with_prior(item, prior)
  return string.sub(item, 1, 1) .. struct.pack('>I4', prior) .. string.sub(item, 6)
end

-- Something is ready: one token (at most) for a blocked consumer.  GET
-- deletes the token when it finds ready empty, so a token is at worst one
-- spurious wake-up.  While ready is not empty a token is there, or a GET
-- that took it (a BLPOP pipelined with a GET) is about to run and passes it
-- on if items remain: so a push onto a list that was not empty needs no
-- token (the scripts call wake only when the list they filled was empty).
-- A token lost with a consumer that died between its BLPOP and its GET
-- costs waiting consumers at most their 1 s wait slice.
local function wake(P)
  if redis.call('EXISTS', P .. 'notify') == 0 then redis.call('RPUSH', P .. 'notify', '1') end
end

-- A consumer's heartbeat: checked (and with refresh, extended) if it holds
-- its token; taken again if it expired (the cleaner may have returned its
-- items meanwhile: acks of those then report them missing); refused if
-- another consumer holds the tag.  GET and SETTLE only check: the
-- consumer's heartbeat thread (or task) extends it.
-- An instance of a topic's logical consumer (B ~= '') may not outlive its
-- consumer: UNSUBSCRIBE leaves GONE in the heartbeat keys of live instances
-- (until their TTL), and a heartbeat taken again needs the consumer still
-- registered.  Returns false when the instance's consumer is gone: the
-- scripts then answer GONE_REPLY and write nothing.
local GONE = 'fastbus:gone'
local GONE_REPLY = -1

-- the logical consumer of topic B whose namespace is P (B .. 'c:' .. name .. ':') is registered
local function registered(B, P)
  return redis.call('SISMEMBER', B .. 'consumers', string.sub(P, #B + 3, -2)) == 1
end

local function beat(P, B, tag, token, ttl, refresh)
  local hb = P .. 'hb:' .. tag
  local cur = redis.call('GET', hb)
  if cur == token then
    if refresh then redis.call('PEXPIRE', hb, ttl) end
    return true
  end
  if cur == GONE then return false end
  if cur then
    error({err = 'FBQ TAKEN consumer tag ' .. tag .. ' is held by another live consumer'})
  end
  if B ~= '' and not registered(B, P) then return false end
  redis.call('SET', hb, token, 'PX', ttl)
  redis.call('SADD', P .. 'consumers', tag)
  return true
end

-- Topic bodies: B is the topic's namespace T.  Bodies live in blocks of
-- 1024 consecutive ids, one hash per block (T..'m:'..block, field = the id's
-- 8 bytes, value = created ms (8 bytes) .. payload), so a publish, a read of
-- an id range or a consumer's get costs a few calls per block instead of
-- several per message.  T..'refs' counts, per block, the consumer-list
-- entries that still need one of its bodies; at zero the block is deleted.
-- T..'blocks' (a sorted set) indexes the blocks so the retained range can be
-- found; entries of blocks that expired are pruned when met.  A block's
-- expiry is set once, when a publish creates it: TTL + TTL/10.  It takes
-- publishes only while more than TTL of that is left (its first TTL/10);
-- a publish that meets a closed block starts its ids at the next block
-- (the rest of the closed block's ids are never given).  So a body lives
-- at least TTL and at most TTL + TTL/10 (unless its consumers are done).
local BLOCK = 1024
local function block_of(id) return math.floor(id / BLOCK) end
local function bkey(B, blk) return B .. 'm:' .. fmt(blk) end

-- the bodies of topic items (headers), aligned with them; false where gone
local function bodies(B, items)
  local out, i = {}, 1
  while i <= #items do
    local blk = block_of(id_of(items[i]))
    local fields, j = {}, i
    while j <= #items and #fields < 1000 and block_of(id_of(items[j])) == blk do
      fields[#fields + 1] = string.sub(items[j], 6, 13)
      j = j + 1
    end
    local vals = redis.call('HMGET', bkey(B, blk), unpack(fields))
    for k = 1, #fields do
      local v = vals[k]
      out[i + k - 1] = v and string.sub(v, 9) or false
    end
    i = j
  end
  return out
end

-- the items (headers) no longer need their bodies: references dropped per block
-- (at = 6: items; at = 1: 8-byte ids)
local function unref(B, items, at)
  local per = {}
  for _, item in ipairs(items) do
    local blk = block_of(struct.unpack('>I8', item, at or 6))
    per[blk] = (per[blk] or 0) + 1
  end
  for blk, k in pairs(per) do
    local f = fmt(blk)
    if redis.call('HINCRBY', B .. 'refs', f, -k) <= 0 then
      redis.call('DEL', bkey(B, blk))
      redis.call('HDEL', B .. 'refs', f)
      redis.call('ZREM', B .. 'blocks', f)
    end
  end
end

-- unref and the body of one item by its 8-byte id, without the helpers
-- (GET1 and ACK1: one message at a time, where every closure counts)
local function unref1(B, id)
  local f = string.format('%.0f', math.floor(struct.unpack('>I8', id) / 1024))
  if redis.call('HINCRBY', B .. 'refs', f, -1) <= 0 then
    redis.call('DEL', B .. 'm:' .. f)
    redis.call('HDEL', B .. 'refs', f)
    redis.call('ZREM', B .. 'blocks', f)
  end
end

local function body1(B, id)
  local v = redis.call('HGET', B .. 'm:' .. string.format('%.0f', math.floor(struct.unpack('>I8', id) / 1024)), id)
  return v and string.sub(v, 9)
end

-- Items to the failed list, in the order given.  The list is
-- self-contained: a topic item takes a copy of its body along and releases
-- its reference.  A topic item whose body already expired cannot be
-- delivered again: it is dropped and counted as expired, not stored empty.
local function to_failed(P, B, items)
  if #items == 0 then return end
  if B ~= '' then
    local b = bodies(B, items)
    unref(B, items)
    local kept = {}
    for i, item in ipairs(items) do
      if b[i] then kept[#kept + 1] = item .. b[i] end
    end
    count(P, 'expired', #items - #kept)
    items = kept
  end
  call_many('RPUSH', P .. 'failed', items, 1000)
end

-- Items back to the head of ready, oldest first.  counted: this was a
-- delivery (requeue, a dead consumer's items); an item delivered max times
-- goes to the failed list instead (oldest first, as it would have been
-- delivered).  Returns returned, dead.
local function give_back(P, B, items, counted, max)
  table.sort(items, function(a, b) return string.sub(a, 6, 13) < string.sub(b, 6, 13) end)
  local back, dead = {}, {}
  for i = 1, #items do
    local item = items[i]
    if counted then
      local prior = struct.unpack('>I4', item, 2) + 1
      item = with_prior(item, prior)
      if max > 0 and prior >= max then
        dead[#dead + 1] = item
        item = nil
      end
    end
    if item then back[#back + 1] = item end
  end
  to_failed(P, B, dead)
  if #back > 0 then
    -- LPUSH puts each argument at the head in turn: newest first, so the
    -- oldest ends up first
    local rev, n = {}, #back
    for i = 1, n do rev[i] = back[n + 1 - i] end
    if call_many('LPUSH', P .. 'ready', rev, 1000) == n then wake(P) end
  end
  return #back, #dead
end

-- a consumer's unacked items back to ready; its keys removed
local function release(P, B, tag, counted, max)
  local u = P .. 'unacked:' .. tag
  local back, dead = give_back(P, B, redis.call('HVALS', u), counted, max)
  redis.call('DEL', u, P .. 'hb:' .. tag)
  redis.call('SREM', P .. 'consumers', tag)
  redis.call('HDEL', P .. 'beats', tag)
  count(P, 'returned', back)
  count(P, 'dead', dead)
  return back, dead
end

-- payloads onto work queue P's ready list -> the first id.  Its first
-- write is INCRBY, which Redis refuses when the server is out of memory
-- (maxmemory): a refused call writes nothing.  (Redis refuses only a
-- script's first write under OOM, and only a deny-oom one: keep a deny-oom
-- write first in put and publish.)
local function put(P, payloads)
  local n = #payloads
  local first = redis.call('INCRBY', P .. 'seq', n) - n + 1
  local now = now_ms()
  local len
  if n == 1 then
    len = redis.call('RPUSH', P .. 'ready', struct.pack('>BI4I8I8', 1, 0, first, now) .. payloads[1])
  else
    local items = {}
    for i = 1, n do items[i] = struct.pack('>BI4I8I8', 1, 0, first + i - 1, now) .. payloads[i] end
    len = call_many('RPUSH', P .. 'ready', items, 1000)
  end
  count(P, 'put', n)
  if len == n then wake(P) end
  return first
end

-- payloads published to topic T: bodies stored once in their blocks, the
-- headers appended to every logical consumer's list -> the first id.  Its
-- first write is INCRBY, as in put.
local function publish(T, ttl, payloads)
  local n = #payloads
  local first = redis.call('INCRBY', T .. 'seq', n) - n + 1
  -- the block of the first id: open (more than ttl left), new (-2), or
  -- closed: then the ids start at the next block (see the block comment)
  local left = redis.call('PTTL', bkey(T, block_of(first)))
  local made = left == -2
  if not made and left <= ttl then
    local skip = (block_of(first) + 1) * BLOCK - first
    first = redis.call('INCRBY', T .. 'seq', skip) - n + 1
    made = true
  end
  local now = now_ms()
  local stamp = struct.pack('>I8', now)
  local names = redis.call('SMEMBERS', T .. 'consumers')
  local fanout = #names > 0
  local pre = struct.pack('>BI4', 1, 0)
  local heads = {}
  -- this loop is the per-message cost of a publish: kept to one pack and
  -- one or two concatenations, with counters instead of # (a search in Lua 5.1)
  local fields, nf, blk = {}, 0, block_of(first)
  local boundary = (blk + 1) * BLOCK
  local function store()
    local bk, f = bkey(T, blk), fmt(blk)
    call_many('HSET', bk, fields, 1000)
    if made then redis.call('PEXPIRE', bk, ttl + math.floor(ttl / 10)) end
    made = true                                -- the blocks after the first are new
    redis.call('ZADD', T .. 'blocks', blk, f)
    if fanout then redis.call('HINCRBY', T .. 'refs', f, nf / 2 * #names) end
  end
  for i = 1, n do
    local id = first + i - 1
    if id >= boundary then
      store()
      fields, nf, blk = {}, 0, block_of(id)
      boundary = (blk + 1) * BLOCK
    end
    local key = struct.pack('>I8', id)
    fields[nf + 1] = key
    fields[nf + 2] = stamp .. payloads[i]
    nf = nf + 2
    if fanout then heads[i] = pre .. key .. stamp end
  end
  store()
  for _, name in ipairs(names) do
    local P = T .. 'c:' .. name .. ':'
    if call_many('RPUSH', P .. 'ready', heads, 1000) == n then wake(P) end
    count(P, 'put', n)
  end
  count(T, 'put', n)
  return first
end
