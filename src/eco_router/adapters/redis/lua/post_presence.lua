-- Renew a gateway's viewer counts for one TTL and apply its changes, in one step.
-- KEYS: the gateway's hash (job field -> viewers), the registry of gateways (sorted set,
--       score = expiry ms on the server's clock); both under one hash tag.
-- ARGV: gateway, ttl ms, '1' to replace every count ('0': apply changes), then field, count
--       pairs (a count of 0 removes the field).
-- Returns 1, or 0 (nothing applied) for changes to counts that lapsed or were never posted:
-- the caller then posts them whole.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local me, ttl, whole = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local expiry = tonumber(redis.call('ZSCORE', KEYS[2], me) or '0')
if not whole and expiry <= now then
  return 0
end
if whole then
  redis.call('DEL', KEYS[1])
end
for i = 4, #ARGV, 2 do
  if ARGV[i + 1] == '0' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
-- An empty hash does not exist: the registry alone says the gateway is live with no viewers.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
redis.call('ZADD', KEYS[2], now + ttl, me)
-- The registry outlives its longest-lived gateway only: gone once every gateway is.
if redis.call('PTTL', KEYS[2]) < ttl then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
