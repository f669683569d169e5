-- publish: KEYS[1]=T..'seq'  ARGV: T, ttl_ms, mark ('' for none), payload...
--   -> first id; 0 if the call was fenced (see RESOLVE)
local T, mark = ARGV[1], ARGV[3]
if not unfenced(T, mark) then return 0 end
local payloads = {}
for i = 4, #ARGV do payloads[i - 3] = ARGV[i] end
local first = publish(T, tonumber(ARGV[2]), payloads)
record(T, mark, first)
return first
