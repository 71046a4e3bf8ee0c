-- Mark a control message acknowledged: never handed to a worker again.
-- KEYS[1]: the job's control state. ARGV[1]: the message id.
-- Returns 1, or 0 for a message it does not hold (never recorded, or expired): nothing is
-- written then, so no key is left without its TTL.
if not redis.call('HGET', KEYS[1], 's:' .. ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 's:' .. ARGV[1], 'acknowledged')
return 1
