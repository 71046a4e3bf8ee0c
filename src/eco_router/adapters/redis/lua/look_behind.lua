-- After a read: on each stream, the first entry pending after the reader's position, one
-- call for every shard instead of an XPENDING each.
-- KEYS: the streams. ARGV: the group, then each stream's position (exclusive).
-- Returns per stream {id, consumer} of that entry, {} when none is pending after the
-- position, or {'ERR', message} when the server refused the stream (no group, wrong type).
local group = ARGV[1]
local found = {}
for i, stream in ipairs(KEYS) do
  local ok, reply = pcall(redis.call, 'XPENDING', stream, group, '(' .. ARGV[i + 1], '+', 1)
  if not ok then
    found[i] = { 'ERR', type(reply) == 'table' and reply.err or tostring(reply) }
  elseif reply[1] then
    found[i] = { reply[1][1], reply[1][2] }
  else
    found[i] = {}
  end
end
return found
