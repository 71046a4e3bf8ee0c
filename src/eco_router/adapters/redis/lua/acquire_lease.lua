-- Take a shard's lease when nobody holds a live one, with the next fencing token.
-- KEYS: lease hash, fencing epoch. ARGV: router, ttl ms.
-- Returns {token, since ms}, or false when another router holds it.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', token, 'since', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return { token, now }
