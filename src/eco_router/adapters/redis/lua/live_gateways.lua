-- The gateways whose viewer counts are live, pruning those that lapsed.
-- KEYS: the registry of gateways (sorted set, score = expiry ms on the server's clock).
-- Returns the live gateways' names.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
