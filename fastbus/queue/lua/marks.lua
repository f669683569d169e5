-- marks.lua: batch markers, for PUT, PUBLISH and RESOLVE.  A put_many or
-- publish_many of several script calls names each call (a random batch token
-- and the call's number); the call records its first id under P..'w:'..mark
-- for MARK_TTL ms (fastbus/queue/_lua.py reads MARK_TTL from here).  If the
-- batch fails part way (a lost connection leaves calls whose reply never
-- came), RESOLVE tells for each call whether it was applied, and fences those
-- that were not: a call that reaches the server after RESOLVE finds its mark
-- taken and writes nothing.  So the error the client raises says exactly
-- what was written.

local MARK_TTL = 600000
-- a call of a marked batch: false if RESOLVE fenced it (it must not write)
local function unfenced(P, mark)
  return mark == '' or redis.call('EXISTS', P .. 'w:' .. mark) == 0
end
local function record(P, mark, first)
  if mark ~= '' then redis.call('SET', P .. 'w:' .. mark, first, 'PX', MARK_TTL) end
end
