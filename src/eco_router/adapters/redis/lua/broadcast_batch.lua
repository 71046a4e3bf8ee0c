-- Publish a batch of messages in one call, in order.
-- ARGV: channel, payload, channel, payload, ...
-- Returns the number of messages published.
for i = 1, #ARGV, 2 do
  redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
end
return #ARGV / 2
