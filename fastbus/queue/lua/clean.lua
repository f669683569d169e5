-- clean: KEYS[1]=a key of the namespace  ARGV: mode ('q' or 't'), base, max, B
--   mode q: base is the namespace P of a queue or of one topic consumer (B
--   is then its topic's T, '' for a queue); mode t: base is the topic's T,
--   and every logical consumer T..'c:'..name..':' is cleaned.
--   -> {returned, dead, consumers removed}
local mode, base, max = ARGV[1], ARGV[2], tonumber(ARGV[3])
local spaces, B = {}, ARGV[4] or ''
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
