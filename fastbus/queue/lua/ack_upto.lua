local T, name, upto, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('SISMEMBER', T .. 'consumers', name) == 0 then return {-1, 0} end
local last = tonumber(redis.call('GET', T .. 'seq') or '0')
if upto > last then return {-2, last} end            -- past the last id: a position nothing reached
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
