-- Give a shard's lease up if the fencing token is still the caller's.
-- KEYS: lease hash, fencing epoch. ARGV: token.
if (redis.call('GET', KEYS[2]) or '0') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
