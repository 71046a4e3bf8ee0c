-- A gateway stops cleanly: its counts go at once.
-- KEYS: the gateway's hash, the registry of gateways. ARGV: gateway.
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
