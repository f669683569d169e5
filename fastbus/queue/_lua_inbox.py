"""The Lua scripts behind :mod:`fastbus.queue.inbox`.

Keys of an inbox namespace ``P = prefix:i:{name}:`` (one hash slot):

    members   ZSET member -> the id it has acked (its marker); the inbox
              exists exactly while this key does
    seq       the last id given (INCR)
    msgs      ZSET id -> packed message

A packed message is a 19-byte header, the sender and the payload::

    version  u8   = 1
    id       u64  from INCR on P..'seq' (so members of msgs are unique)
    created  u64  server time in milliseconds (TIME), when sent
    slen     u16  length of the sender's name in bytes
    sender   slen bytes (UTF-8)
    payload  ...

all big-endian.  The per-user hint ``prefix:u:{member}:inboxes`` (a ZSET
inbox name -> version, in the user's hash slot) is handled by INBOX_HINT
alone: it can never share a script with an inbox's keys on Redis Cluster.

Errors are raised as ``FBQ KIND text`` (see ``_common._translate``).
"""

from __future__ import annotations

from fastbus.queue._lua import _LIB, SCRIPTS

MSG_HEADER = 19

# Helpers of the inbox scripts (after _LIB: now_ms, fmt, call_many).
_INBOX_LIB = _LIB + r"""
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
"""

# create: KEYS[1]=P..'members'  ARGV: P, name, ttl_ms, has_message ('1'/'0'), sender, payload, member...
#   -> {1, id of the first message or 0}, or, if the inbox exists already,
#      {0, {1 if ARGV member i is a member of it else 0, ...}} (the caller
#      then withdraws the hints it added for the others)
INBOX_CREATE = _INBOX_LIB + r"""
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
"""

# join: KEYS[1]=P..'members'  ARGV: P, member, create ('1'/'0')
#   -> {1, marker} joined now (at the last id), {0, marker} a member already,
#      {-1, 0} no such inbox (and create is '0')
INBOX_JOIN = _INBOX_LIB + r"""
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
"""

# leave: KEYS[1]=P..'members'  ARGV: P, member  -> 1 left, 0 was not a member
#   The last member out deletes every key, the id counter with the markers:
#   no marker can outlive the counter it refers to, so a fresh inbox of the
#   same name starting again at id 1 cannot hide messages from anyone.
INBOX_LEAVE = _INBOX_LIB + r"""
local P, member = ARGV[1], ARGV[2]
if redis.call('ZREM', P .. 'members', member) == 0 then return 0 end
if redis.call('EXISTS', P .. 'members') == 0 then
  redis.call('DEL', P .. 'seq', P .. 'msgs')
else
  trim(P)                               -- the leaver may have been the one holding messages back
end
return 1
"""

# send: KEYS[1]=P..'members'  ARGV: P, name, ttl_ms, sender, payload -> id
INBOX_SEND = _INBOX_LIB + r"""
local P, name, sender = ARGV[1], ARGV[2], ARGV[4]
if not redis.call('ZSCORE', P .. 'members', sender) then refuse(P, name, sender) end
return store(P, sender, ARGV[5], tonumber(ARGV[3]))
"""

# fetch: KEYS[1]=P..'members'  ARGV: P, name, ttl_ms, member, count, strict ('1'/'0')
#   -> {marker, {packed...}}: up to count messages after the member's marker,
#   which does not move (ack moves it).  Not a member: an error if strict,
#   else {-1, {}} (fetch_all_pending: a stale hint).
INBOX_FETCH = _INBOX_LIB + r"""
local P, name, member = ARGV[1], ARGV[2], ARGV[4]
local pos = redis.call('ZSCORE', P .. 'members', member)
if not pos then
  if ARGV[6] == '1' then refuse(P, name, member) end
  return {-1, {}}
end
pos = tonumber(pos)
expire(P, tonumber(ARGV[3]), now_ms())
return {pos, redis.call('ZRANGEBYSCORE', P .. 'msgs', '(' .. fmt(pos), '+inf', 'LIMIT', 0, tonumber(ARGV[5]))}
"""

# ack: KEYS[1]=P..'members'  ARGV: P, name, ttl_ms, member, upto -> the member's marker
#   forward only: an upto at or below the marker changes nothing (acks are
#   idempotent, as redelivered messages are acked again); past the last id
#   is refused (it would pre-ack messages not sent yet).
INBOX_ACK = _INBOX_LIB + r"""
local P, name, member, upto = ARGV[1], ARGV[2], ARGV[4], tonumber(ARGV[5])
local pos = redis.call('ZSCORE', P .. 'members', member)
if not pos then refuse(P, name, member) end
pos = tonumber(pos)
local last = tonumber(redis.call('GET', P .. 'seq') or '0')
if upto > last then
  error({err = 'FBQ RANGE cannot ack up to id ' .. fmt(upto) .. ' in inbox ' .. name
               .. ': its last id is ' .. fmt(last)})
end
if upto > pos then
  redis.call('ZADD', P .. 'members', upto, member)
  pos = upto
  trim(P)
end
expire(P, tonumber(ARGV[3]), now_ms())
return pos
"""

# members: KEYS[1]=P..'members'  ARGV: P -> {member, marker, ...} (markers as
#   integers whatever the client's protocol: RESP3 would give ZRANGE pairs of doubles)
INBOX_MEMBERS = r"""
local flat = redis.call('ZRANGE', ARGV[1] .. 'members', 0, -1, 'WITHSCORES')
for i = 2, #flat, 2 do flat[i] = tonumber(flat[i]) end
return flat
"""

# hint: KEYS[1]=prefix:u:{member}:inboxes  (ZSET inbox name -> version)
#   ARGV 'add', inbox        -> the version now held (a new one, > any before)
#   ARGV 'drop', inbox, v    -> 1 removed, 0 left: only if its version is still v
#   ARGV 'list'              -> {inbox, version, ...}
# Versions are server microseconds, and above the highest in the set: a
# hint removed and added again never gets back a version someone may hold,
# so a conditional drop cannot remove a hint added after it looked.
INBOX_HINT = r"""
local U, op = KEYS[1], ARGV[1]
if op == 'add' then
  local t = redis.call('TIME')
  local v = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local top = redis.call('ZRANGE', U, -1, -1, 'WITHSCORES')[2]
  if top and tonumber(top) >= v then v = tonumber(top) + 1 end
  redis.call('ZADD', U, v, ARGV[2])
  return v
elseif op == 'drop' then
  if tonumber(redis.call('ZSCORE', U, ARGV[2]) or '-1') == tonumber(ARGV[3]) then
    return redis.call('ZREM', U, ARGV[2])
  end
  return 0
end
local flat = redis.call('ZRANGE', U, 0, -1, 'WITHSCORES')
for i = 2, #flat, 2 do flat[i] = tonumber(flat[i]) end
return flat
"""

SCRIPTS.update({
    "INBOX_CREATE": INBOX_CREATE,
    "INBOX_JOIN": INBOX_JOIN,
    "INBOX_LEAVE": INBOX_LEAVE,
    "INBOX_SEND": INBOX_SEND,
    "INBOX_FETCH": INBOX_FETCH,
    "INBOX_ACK": INBOX_ACK,
    "INBOX_MEMBERS": INBOX_MEMBERS,
    "INBOX_HINT": INBOX_HINT,
})
