-- Mark a control message acknowledged: never handed to a worker again. Its body leaves the
-- control log and its place among the waiting is freed, so what a worker acknowledged costs
-- neither memory nor reads.
-- KEYS[1]: the job's control state; KEYS[2]: its control log. ARGV[1]: the message id.
-- Returns 1, or 0 for a message it does not hold (never recorded, or expired): nothing is
-- written then, so no key is left without its TTL.
local at = redis.call('HGET', KEYS[1], 's:' .. ARGV[1])
if not at then
  return 0
end
if at ~= 'acknowledged' then
  redis.call('HSET', KEYS[1], 's:' .. ARGV[1], 'acknowledged')
  redis.call('XDEL', KEYS[2], ARGV[1])
  local size = redis.call('HGET', KEYS[1], 'z:' .. ARGV[1])
  -- A message recorded before the counts were kept has no size and was never counted.
  if size then
    redis.call('HINCRBY', KEYS[1], 'waiting', -1)
    redis.call('HINCRBY', KEYS[1], 'waiting_bytes', -tonumber(size))
    redis.call('HINCRBY', KEYS[1], 'version', 1)
  end
end
return 1
