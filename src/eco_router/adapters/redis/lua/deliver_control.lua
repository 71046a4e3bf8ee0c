-- Hand a job's worker its unacknowledged control messages after an id, marking each
-- delivered (its count up); none once the job has ended.
-- KEYS[1]: the job's state; KEYS[2]: its control log; KEYS[3]: its control state.
-- ARGV[1]: the id after which to read ("0-0": all); ARGV[2]: at most this many.
-- Returns {1} when the job has ended, else {0, the log's last id read (ARGV[1] when none),
-- {id, fields, deliveries}..., 1 when the read stopped at its limit}. Acknowledged messages
-- have left the log: a read costs the same whatever their number.
local state = redis.call('GET', KEYS[1])
if state then
  local ok, s = pcall(cjson.decode, state)
  if ok and type(s) == 'table' and (s.stage == 'done' or s.status == 'done' or s.status == 'failed') then
    return { 1 }
  end
end
local last = ARGV[1]
local handed = {}
local entries = redis.call('XRANGE', KEYS[2], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
for _, entry in ipairs(entries) do
  local id = entry[1]
  last = id
  local at = redis.call('HGET', KEYS[3], 's:' .. id)
  if at and at ~= 'acknowledged' then
    redis.call('HSET', KEYS[3], 's:' .. id, 'delivered')
    local deliveries = redis.call('HINCRBY', KEYS[3], 'd:' .. id, 1)
    handed[#handed + 1] = { id, entry[2], deliveries }
  end
end
return { 0, last, handed, #entries >= tonumber(ARGV[2]) and 1 or 0 }
