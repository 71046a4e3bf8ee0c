-- Read new entries of the shards a router holds, each only while its fencing token holds.
-- KEYS: per shard: fencing epoch, stream. ARGV: group, consumer, count, then per shard: token.
-- Returns per shard {1, entries} (read; entries may be empty) or {0} (fenced: another router
-- took it), and when nothing at all was read, after those, each read shard's last entry id
-- (to wait for entries after it).
local group, consumer, count = ARGV[1], ARGV[2], ARGV[3]
local result = {}
local read_any = false
for i = 1, #KEYS, 2 do
  local n = (i + 1) / 2
  if redis.call('GET', KEYS[i]) ~= ARGV[3 + n] then
    result[n] = { 0 }
  else
    local reply = redis.call(
      'XREADGROUP', 'GROUP', group, consumer, 'COUNT', count, 'STREAMS', KEYS[i + 1], '>')
    if reply then
      read_any = true
      result[n] = { 1, reply[1][2] }
    else
      result[n] = { 1, {} }
    end
  end
end
if not read_any then
  for i = 1, #KEYS, 2 do
    local last = redis.call('XREVRANGE', KEYS[i + 1], '+', '-', 'COUNT', 1)
    result[#result + 1] = last[1] and last[1][1] or '0-0'
  end
end
return result
