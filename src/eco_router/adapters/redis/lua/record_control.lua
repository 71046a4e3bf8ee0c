-- Record an admitted control message and append its announcement to the job's shard stream,
-- in one atomic step: both are written, or neither (the shard stream, the job's state and its
-- control keys share one slot). The rules were applied by the caller to what
-- `read_control.lua` read; this only checks that nothing moved since (the log's version, and
-- the job's end, which the router writes) and stores.
-- KEYS[1]: the job's shard stream; KEYS[2]: the job's state; KEYS[3]: its control log (a
--   stream holding the messages not yet acknowledged); KEYS[4]: its control state (the hash
--   `read_control.lua` describes).
-- ARGV: the version read, the request's field, request id, kind, body (a JSON object), its
--   bytes, the message's number, the sender's rate field, its new bucket ("" to keep it), the
--   state TTL in seconds, the shard stream's approximate MAXLEN, job id, stage, status, ts.
-- Returns {"moved"} when the version changed, {"ended"} when the job's state is its end
-- (nothing is written then), else {"new", id}.
if (redis.call('HGET', KEYS[4], 'version') or '0') ~= ARGV[1] then
  return { 'moved' }
end
local state = redis.call('GET', KEYS[2])
if state then
  local ok, s = pcall(cjson.decode, state)
  if ok and type(s) == 'table' and (s.stage == 'done' or s.status == 'done' or s.status == 'failed') then
    return { 'ended' }
  end
end
local number = ARGV[7]
local id = redis.call('XADD', KEYS[3], '*', 'request_id', ARGV[3], 'kind', ARGV[4],
  'body', ARGV[5], 'number', number)
redis.call('HSET', KEYS[4], 'count', number, ARGV[2], id .. ' ' .. number .. ' ' .. ARGV[4],
  'i:' .. number, id, 'n:' .. id, number, 'k:' .. id, ARGV[4], 's:' .. id, 'recorded',
  'd:' .. id, 0, 'z:' .. id, ARGV[6], 'r:' .. id, ARGV[3])
redis.call('HINCRBY', KEYS[4], 'version', 1)
redis.call('HINCRBY', KEYS[4], 'waiting', 1)
redis.call('HINCRBY', KEYS[4], 'waiting_bytes', ARGV[6])
if ARGV[9] ~= '' then
  redis.call('HSET', KEYS[4], ARGV[8], ARGV[9])
end
if ARGV[4] == 'cancel' then
  redis.call('HSETNX', KEYS[4], 'cancel', id)
end
redis.call('EXPIRE', KEYS[3], ARGV[10])
redis.call('EXPIRE', KEYS[4], ARGV[10])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[11], '*', 'job_id', ARGV[12], 'stage', ARGV[13],
  'status', ARGV[14], 'seq', number, 'ts', ARGV[15], 'request_id', ARGV[3], 'control_id', id,
  'result', ARGV[5])
return { 'new', id }
