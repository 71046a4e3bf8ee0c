-- Read what the control rules (`admit`) need to judge a request, in one atomic step; writes
-- nothing.
-- KEYS[1]: the job's state; KEYS[2]: its history; KEYS[3]: its applied-markers; KEYS[4]: its
--   control state (a hash: "version", "count" the messages so far, "waiting" and
--   "waiting_bytes" those not acknowledged, "cancel" the first cancel's id,
--   "request:<sender>:<id>" -> "<message id> <number> <kind>", "rate:<sender>" -> "<tokens>
--   <ms>", "i:<number>" -> message id, and per message id "n:" number, "k:" kind, "s:" state,
--   "d:" deliveries, "z:" body bytes, "r:" request id).
-- ARGV[1]: the request's field; ARGV[2]: the sender's rate field.
-- Returns {keys of the job that exist, state or nil, version, count, waiting, waiting_bytes,
-- first message or nil, cancel id or nil, the cancel's number or nil, bucket or nil}.
local known = redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3])
local state = redis.call('GET', KEYS[1])
local h = redis.call('HMGET', KEYS[4], 'version', 'count', 'waiting', 'waiting_bytes',
  ARGV[1], 'cancel', ARGV[2])
local cancel_number = false
if h[6] then
  cancel_number = redis.call('HGET', KEYS[4], 'n:' .. h[6])
end
return { known, state, h[1], h[2], h[3], h[4], h[5], h[6], cancel_number, h[7] }
