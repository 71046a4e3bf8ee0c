-- Append a progress event once: a repeat within the idempotency window returns the first id.
-- KEYS[1]: the stream; KEYS[2]: the idempotency key, hash-tagged to the stream's slot.
-- ARGV[1]: idempotency TTL in seconds; ARGV[2]: approximate MAXLEN; ARGV[3..]: field, value...
local first = redis.call('GET', KEYS[2])
if first then
  return first
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
redis.call('SET', KEYS[2], id, 'EX', ARGV[1])
return id
