"""The Lua scripts behind :mod:`fastbus.queue`.

Every operation that touches more than one key is one script, so a client
that dies between two commands cannot leave a message in two places or in
none.  The scripts derive the keys of a queue from its namespace ``P`` (passed
in ARGV; ``KEYS[1]`` is a key of the same namespace, so that Redis Cluster
clients route the call to the right node): every key of one queue, topic or
inbox starts with the same ``prefix:kind:{name}:`` and so shares a hash slot.

A work-queue *item* is a 21-byte header and the payload::

    version  u8   = 1
    prior    u32  deliveries so far (0 when put; a consumer's get is delivery prior + 1)
    id       u64  from INCRBY on P..'seq' (monotonic per queue)
    created  u64  server time in milliseconds (TIME), when put
    payload  ...  (empty in a topic consumer's lists: the body is kept once,
                  in the topic's block hash ``m:<id // 1024>``)

all big-endian, so bytes 6..13 (the id) compare like the numbers and serve
as the field name of the unacked hashes.

Keys of a queue namespace P:
    ready           list of items, taken from the head
    failed          list of items (the dead-letter list)
    seq             the last id given
    stats           hash of running totals: put get ack reject requeue dead returned expired
    rate:<second>   hash, the same counters per second of server time (expire after 120 s)
    notify          list of at most one token: wakes one blocked consumer
    consumers       set of consumer tags that may hold unacked items
    hb:<tag>        the consumer's heartbeat: its token, with a TTL
    unacked:<tag>   hash id(8 bytes) -> item, what the consumer holds
"""

from __future__ import annotations

HEADER = 21

# Functions shared by the scripts (prepended to each one).
_LIB = r"""
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
local function call_many(cmd, key, args, step)
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end

local function id_of(item) return struct.unpack('>I8', item, 6) end

local function with_prior(item, prior)
  return string.sub(item, 1, 1) .. struct.pack('>I4', prior) .. string.sub(item, 6)
end

-- Something is ready: one token (at most) for a blocked consumer.  GET
-- deletes the token when it finds ready empty, so a token is at worst one
-- spurious wake-up.
local function wake(P)
  if redis.call('EXISTS', P .. 'notify') == 0 then redis.call('RPUSH', P .. 'notify', '1') end
end

-- A consumer's heartbeat: checked (and with refresh, extended) if it holds
-- its token; taken again if it expired (the cleaner may have returned its
-- items meanwhile: acks of those then report them missing); refused if
-- another consumer holds the tag.  GET and SETTLE only check: the
-- consumer's heartbeat thread (or task) extends it.
local function beat(P, tag, token, ttl, refresh)
  local hb = P .. 'hb:' .. tag
  local cur = redis.call('GET', hb)
  if cur == token then
    if refresh then redis.call('PEXPIRE', hb, ttl) end
  elseif cur then
    error({err = 'FBQ TAKEN consumer tag ' .. tag .. ' is held by another live consumer'})
  else
    redis.call('SET', hb, token, 'PX', ttl)
    redis.call('SADD', P .. 'consumers', tag)
  end
end

-- Topic bodies: B is the topic's namespace T.  Bodies live in blocks of
-- 1024 consecutive ids, one hash per block (T..'m:'..block, field = the id's
-- 8 bytes, value = created ms (8 bytes) .. payload), so a publish, a read of
-- an id range or a consumer's get costs a few calls per block instead of
-- several per message.  T..'refs' counts, per block, the consumer-list
-- entries that still need one of its bodies; at zero the block is deleted.
-- T..'blocks' (a sorted set) indexes the blocks so the retained range can be
-- found; entries of blocks that expired are pruned when met.  A block
-- expires TTL after the last publish into it.
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

local function body(B, item) return bodies(B, {item})[1] or nil end

-- the items (headers) no longer need their bodies: references dropped per block
local function unref(B, items)
  local per = {}
  for _, item in ipairs(items) do
    local blk = block_of(id_of(item))
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

-- to the failed list: self-contained, so a topic item takes its body along
local function to_failed(P, B, item)
  if B ~= '' then
    local b = body(B, item)
    unref(B, {item})
    item = item .. (b or '')
  end
  redis.call('RPUSH', P .. 'failed', item)
end

-- Items back to the head of ready, oldest first.  counted: this was a
-- delivery (requeue, a dead consumer's items); an item delivered max times
-- goes to the failed list instead.  Returns returned, dead.
local function give_back(P, B, items, counted, max)
  table.sort(items, function(a, b) return string.sub(a, 6, 13) < string.sub(b, 6, 13) end)
  local back, dead = {}, 0
  for i = #items, 1, -1 do
    local item = items[i]
    if counted then
      local prior = struct.unpack('>I4', item, 2) + 1
      if max > 0 and prior >= max then
        to_failed(P, B, with_prior(item, prior))
        dead = dead + 1
        item = nil
      else
        item = with_prior(item, prior)
      end
    end
    if item then back[#back + 1] = item end
  end
  if #back > 0 then
    call_many('LPUSH', P .. 'ready', back, 1000)
    wake(P)
  end
  return #back, dead
end

-- a consumer's unacked items back to ready; its keys removed
local function release(P, B, tag, counted, max)
  local u = P .. 'unacked:' .. tag
  local back, dead = give_back(P, B, redis.call('HVALS', u), counted, max)
  redis.call('DEL', u, P .. 'hb:' .. tag)
  redis.call('SREM', P .. 'consumers', tag)
  count(P, 'returned', back)
  count(P, 'dead', dead)
  return back, dead
end

-- payloads onto work queue P's ready list -> the first id
local function put(P, payloads)
  local n = #payloads
  local first = redis.call('INCRBY', P .. 'seq', n) - n + 1
  local now = now_ms()
  local items = {}
  for i = 1, n do items[i] = struct.pack('>BI4I8I8', 1, 0, first + i - 1, now) .. payloads[i] end
  call_many('RPUSH', P .. 'ready', items, 1000)
  count(P, 'put', n)
  wake(P)
  return first
end

-- payloads published to topic T: bodies stored once in their blocks, the
-- headers appended to every logical consumer's list -> the first id
local function publish(T, ttl, payloads)
  local n = #payloads
  local first = redis.call('INCRBY', T .. 'seq', n) - n + 1
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
    redis.call('PEXPIRE', bk, ttl)
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
    call_many('RPUSH', P .. 'ready', heads, 1000)
    count(P, 'put', n)
    wake(P)
  end
  count(T, 'put', n)
  return first
end
"""

# put: KEYS[1]=P..'ready'  ARGV: P, payload...  -> first id
PUT = _LIB + r"""
local payloads = {}
for i = 2, #ARGV do payloads[i - 1] = ARGV[i] end
return put(ARGV[1], payloads)
"""

# register: KEYS[1]=P..'ready'  ARGV: P, tag, token, ttl_ms, B, max
#   -> {returned, dead}: what a previous consumer with this tag left unacked
REGISTER = _LIB + r"""
local P, tag, token, ttl, B, max = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local hb = P .. 'hb:' .. tag
if not redis.call('SET', hb, token, 'NX', 'PX', ttl) then
  if redis.call('GET', hb) ~= token then
    error({err = 'FBQ TAKEN consumer tag ' .. tag .. ' is held by another live consumer'})
  end
  redis.call('PEXPIRE', hb, ttl)
  return {0, 0}
end
local back, dead = 0, 0
if redis.call('EXISTS', P .. 'unacked:' .. tag) == 1 then
  back, dead = release(P, B, tag, true, max)
  redis.call('SET', hb, token, 'PX', ttl)
end
redis.call('SADD', P .. 'consumers', tag)
return {back, dead}
"""

# heartbeat: KEYS[1]=P..'ready'  ARGV: P, tag, token, ttl_ms -> 1
HEARTBEAT = _LIB + r"""
beat(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), true)
return 1
"""

# get: KEYS[1]=P..'ready'  ARGV: P, tag, token, ttl_ms, n, B  -> items (with bodies)
GET = _LIB + r"""
local P, tag, token, ttl, n, B = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
beat(P, tag, token, ttl, false)
local items = redis.call('LPOP', P .. 'ready', n)
if not items or #items < n then
  redis.call('DEL', P .. 'notify')      -- ready is empty now
  if not items then return {} end
else
  wake(P)                               -- maybe more: the next blocked consumer
end
local fields = {}
for i, item in ipairs(items) do
  fields[2 * i - 1] = string.sub(item, 6, 13)
  fields[2 * i] = item
end
local u = P .. 'unacked:' .. tag
call_many('HSET', u, fields, 1000)
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
"""

# settle: KEYS[1]=P..'ready'
#   ARGV: P, tag, token, ttl_ms, B, max, then three strings of 8-byte ids
#         joined: to ack, to reject, to requeue (one argument each: a
#         thousand ids cost the client one argument, not a thousand)
#   -> {acked, rejected, requeued, dead, {positions (1-based, acks first) not held}}
SETTLE = _LIB + r"""
local P, tag, token, ttl, B, max = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
beat(P, tag, token, ttl, false)
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
  local del, done = {}, {}
  for j = 1, #chunk do
    if held[j] then
      del[#del + 1] = chunk[j]
      done[#done + 1] = held[j]
    else
      missing[#missing + 1] = i + j - 1
    end
  end
  if #del > 0 then redis.call('HDEL', u, unpack(del)) end
  if B ~= '' then unref(B, done) end
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
take(rejects, #acks, function(item)
  to_failed(P, B, with_prior(item, struct.unpack('>I4', item, 2) + 1))
  rejected = rejected + 1
end)
take(requeues, #acks + #rejects, function(item) again[#again + 1] = item end)
local requeued, dead = give_back(P, B, again, true, max)
count(P, 'ack', acked)
count(P, 'reject', rejected)
count(P, 'requeue', requeued)
count(P, 'dead', dead)
return {acked, rejected, requeued, dead, missing}
"""

# release: KEYS[1]=P..'ready'  ARGV: P, tag, token, B  -> {returned, 0}
#   a consumer's graceful close: its unacked items back to ready, uncounted
RELEASE = _LIB + r"""
local P, tag, token, B = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('GET', P .. 'hb:' .. tag)
if cur and cur ~= token then return {0, 0} end
return {release(P, B, tag, false, 0)}
"""

# clean: KEYS[1]=a key of the namespace  ARGV: mode ('q' or 't'), base, max
#   mode q: base is the queue's P; mode t: base is the topic's T, and every
#   logical consumer T..'c:'..name..':' is cleaned.
#   -> {returned, dead, consumers removed}
CLEAN = _LIB + r"""
local mode, base, max = ARGV[1], ARGV[2], tonumber(ARGV[3])
local spaces, B = {}, ''
if mode == 't' then
  B = base
  for _, name in ipairs(redis.call('SMEMBERS', base .. 'consumers')) do
    spaces[#spaces + 1] = base .. 'c:' .. name .. ':'
  end
else
  spaces[1] = base
end
local back, dead, gone = 0, 0, 0
for _, P in ipairs(spaces) do
  for _, tag in ipairs(redis.call('SMEMBERS', P .. 'consumers')) do
    if redis.call('EXISTS', P .. 'hb:' .. tag) == 0 then
      local b, d = release(P, B, tag, true, max)
      back, dead, gone = back + b, dead + d, gone + 1
    end
  end
end
return {back, dead, gone}
"""

# stats: KEYS[1]=P..'ready'  ARGV: P, seconds of rate buckets
#   -> {ready, failed, {stats hash flat}, {tag, unacked, hb pttl, ...}, now_s, {second, {bucket flat}, ...}}
STATS = _LIB + r"""
local P, secs = ARGV[1], tonumber(ARGV[2])
local consumers = {}
for _, tag in ipairs(redis.call('SMEMBERS', P .. 'consumers')) do
  consumers[#consumers + 1] = tag
  consumers[#consumers + 1] = redis.call('HLEN', P .. 'unacked:' .. tag)
  consumers[#consumers + 1] = redis.call('PTTL', P .. 'hb:' .. tag)
end
local now = tonumber(redis.call('TIME')[1])
local buckets = {}
for s = now - secs, now do
  buckets[#buckets + 1] = s
  buckets[#buckets + 1] = redis.call('HGETALL', P .. 'rate:' .. s)
end
return {redis.call('LLEN', P .. 'ready'), redis.call('LLEN', P .. 'failed'),
        redis.call('HGETALL', P .. 'stats'), consumers, now, buckets}
"""

# return_failed: KEYS[1]=P..'ready'  ARGV: P, n (0 = all), B, ttl_ms  -> how many
#   the oldest failed items back to the tail of ready, delivery count reset.
#   A topic consumer's failed item carries its body (see to_failed): the body
#   goes back into its block (made again, with the topic's TTL, if it
#   expired), taking a reference, and the header alone to ready.
RETURN_FAILED = _LIB + r"""
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
    -- field = the id's 8 bytes, value = created ms .. payload (header bytes 14..21, then the body)
    redis.call('HSET', bk, string.sub(item, 6, 13), string.sub(item, 14))
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
"""

# purge: KEYS[1]=P..'ready'  ARGV: P, which ('ready' or 'failed'), B -> how many
PURGE = _LIB + r"""
local P, which, B = ARGV[1], ARGV[2], ARGV[3]
local items = redis.call('LRANGE', P .. which, 0, -1)
if B ~= '' and which == 'ready' then unref(B, items) end
redis.call('DEL', P .. which)
if which == 'ready' then redis.call('DEL', P .. 'notify') end
return #items
"""

# -- topics: T = prefix:t:{name}:  (seq, consumers = logical names, stats,
#    m:<block> bodies, refs, blocks: see bodies() in _LIB)

# publish: KEYS[1]=T..'seq'  ARGV: T, ttl_ms, payload...  -> first id
PUBLISH = _LIB + r"""
local payloads = {}
for i = 3, #ARGV do payloads[i - 2] = ARGV[i] end
return publish(ARGV[1], tonumber(ARGV[2]), payloads)
"""

# subscribe: KEYS[1]=T..'seq'  ARGV: T, name -> {new (1/0), last id}
SUBSCRIBE = _LIB + r"""
local T, name = ARGV[1], ARGV[2]
local new = redis.call('SADD', T .. 'consumers', name)
local last = tonumber(redis.call('GET', T .. 'seq') or '0')
if new == 1 then redis.call('SET', T .. 'c:' .. name .. ':pos', last) end
return {new, last}
"""

# unsubscribe: KEYS[1]=T..'seq'  ARGV: T, name -> pending items dropped
#   every item it still had (ready or unacked) releases its body reference
UNSUBSCRIBE = _LIB + r"""
local T, name = ARGV[1], ARGV[2]
local P, B = T .. 'c:' .. name .. ':', T
if redis.call('SREM', T .. 'consumers', name) == 0 then return -1 end
local dropped = 0
local function drop(items)
  unref(B, items)
  dropped = dropped + #items
end
drop(redis.call('LRANGE', P .. 'ready', 0, -1))
local keys = {P .. 'ready', P .. 'failed', P .. 'stats', P .. 'notify', P .. 'consumers', P .. 'pos'}
for _, tag in ipairs(redis.call('SMEMBERS', P .. 'consumers')) do
  drop(redis.call('HVALS', P .. 'unacked:' .. tag))
  keys[#keys + 1] = P .. 'unacked:' .. tag
  keys[#keys + 1] = P .. 'hb:' .. tag
end
local now = tonumber(redis.call('TIME')[1])
for sec = now - 121, now do keys[#keys + 1] = P .. 'rate:' .. sec end   -- they would expire anyway
call_many('DEL', keys[1], {unpack(keys, 2)}, 1000)
return dropped
"""

# read: KEYS[1]=T..'seq'  ARGV: T, first id, last id
#   -> one value per id (8-byte created ms .. payload), nil where not retained
READ = _LIB + r"""
local T, a, b = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
local id = a
while id <= b do
  local blk = block_of(id)
  local last = math.min(b, (blk + 1) * BLOCK - 1)
  local fields = {}
  for i = id, last do fields[#fields + 1] = struct.pack('>I8', i) end
  local vals = redis.call('HMGET', bkey(T, blk), unpack(fields))
  for k = 1, #fields do out[#out + 1] = vals[k] end
  id = last + 1
end
return out
"""

# retained: KEYS[1]=T..'seq'  ARGV: T -> {first retained id (0: none), last id}
#   the oldest block that still exists (entries of expired blocks pruned, at
#   most 1000 a call, so a long-idle topic cannot stall the server: -1 then
#   means "call again")
RETAINED = _LIB + r"""
local T = ARGV[1]
local last = tonumber(redis.call('GET', T .. 'seq') or '0')
for _ = 1, 1000 do
  local head = redis.call('ZRANGE', T .. 'blocks', 0, 0)
  if #head == 0 then return {0, last} end
  local ids = redis.call('HKEYS', bkey(T, tonumber(head[1])))
  if #ids > 0 then
    local low = ids[1]
    for _, f in ipairs(ids) do if f < low then low = f end end
    return {struct.unpack('>I8', low), last}
  end
  redis.call('ZREM', T .. 'blocks', head[1])
end
return {-1, last}
"""

# ack_upto: KEYS[1]=T..'seq'  ARGV: T, name, last id, n
#   a logical consumer read by position (the Spark source): its ready items
#   with ids <= last leave its list (at most n per call), their bodies'
#   references dropped, and its position P..'pos' (set to the last id when
#   it was registered) moves up to last.
#   -> {removed, 1 if more may remain}; -1: no such consumer

# position: KEYS[1]=T..'seq'  ARGV: T, name -> the consumer's position: the
#   last id it acked up to (or was registered at); -1: no such consumer.
#   Consumers registered before positions were kept: the id before their
#   oldest pending message, else the last id.
POSITION = _LIB + r"""
local T, name = ARGV[1], ARGV[2]
if redis.call('SISMEMBER', T .. 'consumers', name) == 0 then return -1 end
local P = T .. 'c:' .. name .. ':'
local pos = redis.call('GET', P .. 'pos')
if pos then return tonumber(pos) end
local head = redis.call('LINDEX', P .. 'ready', 0)
if head then return id_of(head) - 1 end
return tonumber(redis.call('GET', T .. 'seq') or '0')
"""
ACK_UPTO = _LIB + r"""
local T, name, upto, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('SISMEMBER', T .. 'consumers', name) == 0 then return {-1, 0} end
local P = T .. 'c:' .. name .. ':'
local pos = tonumber(redis.call('GET', P .. 'pos') or '0')
if upto > pos then redis.call('SET', P .. 'pos', upto) end
local items = redis.call('LRANGE', P .. 'ready', 0, n - 1)
local k = 0
while k < #items and id_of(items[k + 1]) <= upto do k = k + 1 end
if k == 0 then return {0, 0} end
redis.call('LTRIM', P .. 'ready', k, -1)
for i = #items, k + 1, -1 do items[i] = nil end
unref(T, items)
count(P, 'ack', k)
return {k, k == n and 1 or 0}
"""

# topic_info: KEYS[1]=T..'seq'  ARGV: T -> {last id, {names}, {stats flat}}
TOPIC_INFO = _LIB + r"""
local T = ARGV[1]
return {tonumber(redis.call('GET', T .. 'seq') or '0'), redis.call('SMEMBERS', T .. 'consumers'),
        redis.call('HGETALL', T .. 'stats')}
"""

# -- the exactly-once writer of the Spark sink (fastbus.spark): rows staged
#    by the tasks in lists (one per task), published by the driver's commit.

# commit_staged: KEYS[1]=a key of the target's slot
#   ARGV: kind ('t' topic, 'q' work queue, 'c' channel), target (T, P or the
#         channel), ttl_ms (topics), S (the sink's state hash), batch id,
#         n (rows per call), staged list keys in row order...
#   -> {rows published by this call, 1 when the batch is done}
#   S holds done (the last batch fully published) and, while one is half
#   published, batch and pos (rows of it published so far, in row order).
#   A batch at or below done publishes nothing (a replay); a batch whose
#   commit died half way (batch = this one) goes on from pos, skipping the
#   rows of its staged lists (a replayed batch has the same rows) that went.
COMMIT_STAGED = _LIB + r"""
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
"""

SCRIPTS = {name: src for name, src in globals().items()
           if name.isupper() and name not in ("HEADER", "SCRIPTS") and isinstance(src, str)}
