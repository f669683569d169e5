-- leave: KEYS[1]=P..'members'  ARGV: P, member  -> 1 left, 0 was not a member,
--   2 left and the inbox is gone (the caller removes its name from the registry).
--   The last member out deletes every key, the id counter with the markers:
--   no marker can outlive the counter it refers to, so a fresh inbox of the
--   same name starting again at id 1 cannot hide messages from anyone.
local P, member = ARGV[1], ARGV[2]
if redis.call('ZREM', P .. 'members', member) == 0 then return 0 end
if redis.call('EXISTS', P .. 'members') == 0 then
  redis.call('DEL', P .. 'seq', P .. 'msgs', P .. 'stats')
  return 2
end
trim(P)                                 -- the leaver may have been the one holding messages back
return 1
