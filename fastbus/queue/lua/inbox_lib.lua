-- inbox_lib.lua: the functions of the inbox scripts (inbox_*.lua), on top
-- of lib.lua's (now_ms, fmt, call_many).
--
-- Keys of an inbox namespace P = prefix:i:{name}: (one hash slot):
--
--     members   ZSET member -> the id it has acked (its marker); the inbox
--               exists exactly while this key does
--     seq       the last id given (INCR): also the count of messages sent
--     msgs      ZSET id -> packed message
--     stats     hash of running totals (for monitoring): ack (ids a member's
--               marker moved over, summed over members), expired (messages
--               removed by the ttl)
--
-- A packed message is a 19-byte header, the sender and the payload:
--
--     version  u8   = 1
--     id       u64  from INCR on P..'seq' (so members of msgs are unique)
--     created  u64  server time in milliseconds (TIME), when sent
--     slen     u16  length of the sender's name in bytes
--     sender   slen bytes (UTF-8)
--     payload  ...
--
-- all big-endian.  The per-user hint prefix:u:{member}:inboxes (a ZSET
-- inbox name -> version, in the user's hash slot) is handled by INBOX_HINT
-- alone: it can never share a script with an inbox's keys on Redis Cluster.
--
-- Errors are raised as FBQ KIND text (see fastbus/queue/_common.py).

-- a member not found: say whether the whole inbox is missing
local function refuse(P, name, member)
  if redis.call('EXISTS', P .. 'members') == 0 then
    error({err = 'FBQ NOINBOX no inbox named ' .. name .. ' (create it first)'})
  end
  error({err = 'FBQ NOTMEMBER ' .. member .. ' is not a member of inbox ' .. name})
end

local function created(m) return struct.unpack('>I8', m, 10) end

-- Messages older than ttl ms leave (ttl 0: kept until acked).  Ids are given
-- in server-time order, so the expired messages are a prefix of msgs by
-- rank: look at the oldest (the usual answer: nothing to do), else binary
-- search the prefix's length and drop it with one ZREMRANGEBYRANK.
local function expire(P, ttl, now)
  if ttl <= 0 then return end
  local M, limit = P .. 'msgs', now - ttl
  local oldest = redis.call('ZRANGE', M, 0, 0)[1]
  if not oldest or created(oldest) >= limit then return end
  local lo, hi = 1, redis.call('ZCARD', M)      -- expired count is in [lo, hi]
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)   -- is rank mid-1 expired?
    if created(redis.call('ZRANGE', M, mid - 1, mid - 1)[1]) < limit then lo = mid else hi = mid - 1 end
  end
  redis.call('ZREMRANGEBYRANK', M, 0, lo - 1)
  redis.call('HINCRBY', P .. 'stats', 'expired', lo)
end

-- Messages every member has acked leave: all ids <= the lowest marker.
local function trim(P)
  local low = redis.call('ZRANGE', P .. 'members', 0, 0, 'WITHSCORES')[2]
  if low then redis.call('ZREMRANGEBYSCORE', P .. 'msgs', '-inf', low) end
end

-- INCR and store in one step: no lock, and no reader can see id n+1 before
-- id n is stored (the book's reason for its lock).
local function store(P, sender, payload, ttl)
  local now = now_ms()
  local id = redis.call('INCR', P .. 'seq')
  redis.call('ZADD', P .. 'msgs', id, struct.pack('>BI8I8I2', 1, id, now, #sender) .. sender .. payload)
  expire(P, ttl, now)
  return id
end
