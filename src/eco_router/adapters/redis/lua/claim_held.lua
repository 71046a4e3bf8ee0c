-- XAUTOCLAIM on a shard the router holds, only while its fencing token holds, with the
-- delivery count of every claimed entry.
-- KEYS: fencing epoch, stream. ARGV: group, consumer, token, min idle ms, cursor, count.
-- Returns false when fenced, else {next cursor, claimed entries, deleted ids, counts, the
-- group's last delivered id (read before claiming) when the cursor is 0-0, else false}.
-- A shard without an epoch yet has epoch 0.
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[3] then
  return false
end
local group, consumer = ARGV[1], ARGV[2]
local last_delivered = false
if ARGV[5] == '0-0' and redis.call('EXISTS', KEYS[2]) == 1 then
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    local fields = {}
    for i = 1, #info, 2 do
      fields[info[i]] = info[i + 1]
    end
    if fields['name'] == group then
      last_delivered = fields['last-delivered-id']
    end
  end
end
local reply = redis.call('XAUTOCLAIM', KEYS[2], group, consumer, ARGV[4], ARGV[5], 'COUNT', ARGV[6])
local counts = {}
for n, entry in ipairs(reply[2]) do
  local pending = redis.call('XPENDING', KEYS[2], group, entry[1], entry[1], 1)
  counts[n] = pending[1] and pending[1][4] or 1
end
return { reply[1], reply[2], reply[3] or {}, counts, last_delivered }
