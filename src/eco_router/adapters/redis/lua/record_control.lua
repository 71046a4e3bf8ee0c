-- Record a control message and append its announcement to the job's shard stream, in one
-- atomic step: both are written, or neither (the shard stream, the job's state and its
-- control keys share one slot).
-- KEYS[1]: the job's shard stream; KEYS[2]: the job's state; KEYS[3]: its control log (a
--   stream); KEYS[4]: its control state (a hash: "request:<id>" -> message id, per message
--   "n:<id>" its number, "k:<id>" its kind, "s:<id>" its state, "d:<id>" its deliveries,
--   "count" the messages so far, "cancel" the first cancel's id).
-- ARGV: request id, kind, body (a JSON object), the state TTL in seconds, the shard
--   stream's approximate MAXLEN, job id, stage, status, ts.
-- Returns {"duplicate", id, number, kind} for a request id recorded before (nothing is
-- written), {"ended"} when the job's state is its end (done, or failed), else
-- {"new", id, number, kind}.
local known = redis.call('HGET', KEYS[4], 'request:' .. ARGV[1])
if known then
  local first = redis.call('HMGET', KEYS[4], 'n:' .. known, 'k:' .. known)
  return { 'duplicate', known, tonumber(first[1]), first[2] }
end
local state = redis.call('GET', KEYS[2])
if state then
  local ok, s = pcall(cjson.decode, state)
  if ok and type(s) == 'table' and (s.stage == 'done' or s.status == 'done' or s.status == 'failed') then
    return { 'ended' }
  end
end
local number = redis.call('HINCRBY', KEYS[4], 'count', 1)
local id = redis.call('XADD', KEYS[3], '*', 'request_id', ARGV[1], 'kind', ARGV[2],
  'body', ARGV[3], 'number', number)
redis.call('HSET', KEYS[4], 'request:' .. ARGV[1], id, 'n:' .. id, number, 'k:' .. id, ARGV[2],
  's:' .. id, 'recorded', 'd:' .. id, 0)
if ARGV[2] == 'cancel' then
  redis.call('HSETNX', KEYS[4], 'cancel', id)
end
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('EXPIRE', KEYS[4], ARGV[4])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*', 'job_id', ARGV[6], 'stage', ARGV[7],
  'status', ARGV[8], 'seq', number, 'ts', ARGV[9], 'request_id', ARGV[1], 'control_id', id,
  'result', ARGV[3])
return { 'new', id, number, ARGV[2] }
