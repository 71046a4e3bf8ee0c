-- Read new entries of the shards a router holds, each only while its fencing token holds.
-- KEYS: per shard: fencing epoch, stream. ARGV: group, consumer, count, then per shard: token.
-- Returns per shard {1, entries} (read; entries may be empty) or {0} (fenced: another router
-- took it), and when the read drained every shard (none gave `count` entries), after those,
-- each read shard's last entry id (to wait for entries after it). A shard without an epoch
-- yet has epoch 0.
local group, consumer, count = ARGV[1], ARGV[2], ARGV[3]
local result = {}
local read = {}
local drained = true
for i = 1, #KEYS, 2 do
  local n = (i + 1) / 2
  if (redis.call('GET', KEYS[i]) or '0') ~= ARGV[3 + n] then
    result[n] = { 0 }
  else
    read[#read + 1] = KEYS[i + 1]
    local reply = redis.call(
      'XREADGROUP', 'GROUP', group, consumer, 'COUNT', count, 'STREAMS', KEYS[i + 1], '>')
    if reply then
      drained = drained and #reply[1][2] < tonumber(count)
      result[n] = { 1, reply[1][2] }
    else
      result[n] = { 1, {} }
    end
  end
end
if drained then
  for _, stream in ipairs(read) do
    local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    result[#result + 1] = last[1] and last[1][1] or '0-0'
  end
end
return result
