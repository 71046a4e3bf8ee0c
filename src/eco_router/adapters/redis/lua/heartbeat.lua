-- Mark a router alive and renew the leases it still holds; return the group as it is now.
-- KEYS: the live-routers sorted set (when ARGV[3] is '1'), then per shard: lease hash,
--       fencing epoch. On a Redis Cluster the set and each slot's shards are separate calls.
-- ARGV: router, ttl ms, '1' or '0' (the set is KEYS[1] or absent), then per shard the
--       router's token for it ('' when not held).
-- A held lease is renewed while the shard's epoch is still the router's token, even when it
-- lapsed meanwhile (nobody took the shard, so nothing was routed by anyone else).
-- Returns: now ms (the server's clock), {router, expiry ms, ...} ({} without the set), per
-- shard {owner, token, since ms, ms left} ({} when nobody holds it).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local me, ttl = ARGV[1], tonumber(ARGV[2])
local first = 1
local routers = {}
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], now + ttl, me)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  routers = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  first = 2
end
local leases = {}
for i = first, #KEYS, 2 do
  local n = (i - first) / 2 + 1
  local token = ARGV[3 + n]
  if token ~= '' and (redis.call('GET', KEYS[i + 1]) or '0') == token then
    local since = redis.call('HGET', KEYS[i], 'since')
    if not since or redis.call('HGET', KEYS[i], 'token') ~= token then
      since = tostring(now)
    end
    redis.call('HSET', KEYS[i], 'owner', me, 'token', token, 'since', since)
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
  local lease = redis.call('HMGET', KEYS[i], 'owner', 'token', 'since')
  if lease[1] then
    leases[n] = { lease[1], lease[2], lease[3], redis.call('PTTL', KEYS[i]) }
  else
    leases[n] = {}
  end
end
return { now, routers, leases }
