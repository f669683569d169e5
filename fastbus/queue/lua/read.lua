-- read: KEYS[1]=T..'seq'  ARGV: T, first id, last id
--   -> one value per id (8-byte created ms .. payload), nil where not retained
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
