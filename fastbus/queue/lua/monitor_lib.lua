-- monitor_lib.lua: for the read-only monitoring scripts (monitor_*.lua,
-- used by fastbus.monitor.queues): everything a monitor shows of one work
-- queue, topic or inbox in one call, so a sample of N queues costs N script
-- calls, and each reads a consistent state.  Nothing here writes.  The
-- counters they read are kept by the scripts that change the queues (stats
-- hashes), and the consumers' last heartbeats by REGISTER and HEARTBEAT
-- (beats).

-- What one queue namespace P (a work queue, or one logical consumer of a
-- topic) shows: {ready, failed, {stats flat}, {tag, unacked, heartbeat pttl
-- (ms; -2: expired), last heartbeat (server ms; 0: none recorded), ...},
-- created ms of the oldest ready item (0: none)}
local function space(P)
  local cons = {}
  for _, tag in ipairs(redis.call('SMEMBERS', P .. 'consumers')) do
    cons[#cons + 1] = tag
    cons[#cons + 1] = redis.call('HLEN', P .. 'unacked:' .. tag)
    cons[#cons + 1] = redis.call('PTTL', P .. 'hb:' .. tag)
    cons[#cons + 1] = tonumber(redis.call('HGET', P .. 'beats', tag) or '0')
  end
  local head = redis.call('LINDEX', P .. 'ready', 0)
  local oldest = 0
  if head and #head >= 21 then oldest = struct.unpack('>I8', head, 14) end
  return {redis.call('LLEN', P .. 'ready'), redis.call('LLEN', P .. 'failed'),
          redis.call('HGETALL', P .. 'stats'), cons, oldest}
end
