-- A page of a job's control messages for the console: the latest ones, each with its state,
-- size and the start of its body while the log keeps it. Writes nothing.
-- KEYS[1]: the job's control state; KEYS[2]: its control log.
-- ARGV[1]: at most this many messages; ARGV[2]: at most this many bytes of each body.
-- Returns {count, waiting, waiting_bytes, {id, number, kind, state, deliveries, bytes,
-- request id, preview or nil}...}.
local h = redis.call('HMGET', KEYS[1], 'count', 'waiting', 'waiting_bytes')
local count = tonumber(h[1] or '0')
local page = {}
for number = math.max(1, count - tonumber(ARGV[1]) + 1), count do
  local id = redis.call('HGET', KEYS[1], 'i:' .. number)
  if id then
    local m = redis.call('HMGET', KEYS[1], 'k:' .. id, 's:' .. id, 'd:' .. id, 'z:' .. id,
      'r:' .. id)
    local preview = false
    if m[2] ~= 'acknowledged' then
      local entry = redis.call('XRANGE', KEYS[2], id, id)[1]
      if entry then
        for i = 1, #entry[2], 2 do
          if entry[2][i] == 'body' then
            preview = string.sub(entry[2][i + 1], 1, tonumber(ARGV[2]))
          end
        end
      end
    end
    page[#page + 1] = { id, number, m[1], m[2], m[3] or '0', m[4] or '0', m[5] or '', preview }
  end
end
return { count, h[2] or '0', h[3] or '0', page }
