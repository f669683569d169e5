-- put: KEYS[1]=P..'ready'  ARGV: P, mark ('' for none), payload...
--   -> first id; 0 if the call was fenced (see RESOLVE)
local P, mark = ARGV[1], ARGV[2]
if not unfenced(P, mark) then return 0 end
local payloads = {}
for i = 3, #ARGV do payloads[i - 2] = ARGV[i] end
local first = put(P, payloads)
record(P, mark, first)
return first
