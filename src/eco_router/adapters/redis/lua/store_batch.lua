-- Store a batch's writes, as `domain.settle` decided them, atomically, on the shards whose
-- fencing token still holds and whose read came in order. Nothing is judged here.
-- KEYS: the fencing epoch of each shard written, then each one's stream, then per job its
--       state, history and markers keys (and its text state and text keys when its flags say
--       so), then any other key to check absent.
-- ARGV: the consumer group, the number of shards, per shard one value: its token, followed,
--       when there is a read to check, by " (<after> <first> <consumer>": where the read
--       began (exclusive), the first entry it brought and the consumer that read it; then
--       the keys the caller assumed absent ("<key index> ..."), the entries it assumed its
--       streams hold ("<shard index> <entry> ..."), the state's, the history's
--       (and text's) and the markers' TTLs, the number of jobs, then per job six numbers:
--       its shard's index, its flags (below), how many payloads its history appends, how
--       many values its markers and its text state set, how many of the oldest payloads its
--       history drops; then its values: the payloads, the state (STATE_OWN), the text
--       (TEXT_SET, TEXT_APPEND), the markers' fields and values, the text state's.
-- Returns {fenced shards, gap shards, TIME, present keys, missing entries}: the 1-based
-- indices of the shards whose token is no longer the caller's, then of those where an entry
-- another consumer read (or a read whose reply was lost) comes before the read's first (their
-- writes are left out), the server's time, from which the caller knows when the next TTL
-- renewals are due, the keys assumed absent that exist and the entries assumed held that are
-- not ("<shard index> <entry>"): when there is one of either, nothing is written.
local redis_call, tonumber, unpack, band, min = redis.call, tonumber, unpack, bit.band, math.min
local TEXT_KEYS, TEXT_SET, TEXT_APPEND, TEXT_FORGET, TEXT_RENEW = 1, 2, 4, 8, 16
local STATE_LAST, STATE_OWN, STATE_RENEW, HISTORY_RENEW, MARKERS_RENEW = 32, 64, 128, 256, 512
local group = ARGV[1]
local shards = tonumber(ARGV[2])

local skipped, fenced, gaps = {}, {}, {}
-- One MGET for every shard's epoch: a command per shard costs more than the check itself.
local epochs = redis_call('MGET', unpack(KEYS, 1, shards))
for shard = 1, shards do
  local given = ARGV[2 + shard]
  local token, after, read_first, consumer = string.match(given, '^(%S+) (%S+) (%S+) (.*)$')
  if (epochs[shard] or '0') ~= (token or given) then
    skipped[shard] = true
    fenced[#fenced + 1] = shard
  elseif token then
    -- The first entry pending after where the read began must be the read's own first.
    local reply = redis.pcall('XPENDING', KEYS[shards + shard], group, after, '+', 1)
    local first = not reply.err and reply[1]
    if first and (first[1] ~= read_first or first[2] ~= consumer) then
      skipped[shard] = true
      gaps[#gaps + 1] = shard
    end
  end
end

-- A job the caller has not read is assumed new, and an entry a marker names still held: if
-- one is not so, the caller reads it and settles the batch again.
local missing = {}
for shard, entry in string.gmatch(ARGV[shards + 4], '(%d+) (%S+)') do
  if #redis_call('XRANGE', KEYS[shards + tonumber(shard)], entry, entry, 'COUNT', 1) == 0 then
    missing[#missing + 1] = shard .. ' ' .. entry
  end
end
local assumed = {}
for key in string.gmatch(ARGV[shards + 3], '%d+') do
  assumed[#assumed + 1] = tonumber(key)
end
for at = 1, #assumed, 1000 do
  local names = {}
  for n = at, min(at + 999, #assumed) do
    names[#names + 1] = KEYS[assumed[n]]
  end
  if redis_call('EXISTS', unpack(names)) > 0 then
    local present = {}
    for _, key in ipairs(assumed) do
      if redis_call('EXISTS', KEYS[key]) == 1 then
        present[#present + 1] = key
      end
    end
    return { fenced, gaps, redis_call('TIME'), present, missing }
  end
end
if #missing > 0 then
  return { fenced, gaps, redis_call('TIME'), {}, missing }
end

-- `command` on `key` with the `count` values from ARGV[at] on, a thousand at a time (unpack
-- is bounded by the Lua stack; field-value pairs stay whole); nothing when `count` is 0.
local function many(command, key, at, count)
  for first = at, at + count - 1, 1000 do
    redis_call(command, key, unpack(ARGV, first, min(first + 999, at + count - 1)))
  end
end

local state_ttl, history_ttl, markers_ttl = ARGV[shards + 5], ARGV[shards + 6], ARGV[shards + 7]
local at, key = shards + 9, shards * 2 + 1
for _ = 1, tonumber(ARGV[shards + 8]) do
  local shard, flags = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  local appended, marks = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local texts, dropped = tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5])
  local state, history, markers = KEYS[key], KEYS[key + 1], KEYS[key + 2]
  local text_state, text = KEYS[key + 3], KEYS[key + 4]
  key = key + (band(flags, TEXT_KEYS) ~= 0 and 5 or 3)
  local payloads = at + 6
  at = payloads + appended
  local own, text_value
  if band(flags, STATE_OWN) ~= 0 then
    own, at = ARGV[at], at + 1
  end
  if band(flags, TEXT_SET + TEXT_APPEND) ~= 0 then
    text_value, at = ARGV[at], at + 1
  end
  local marks_at, texts_at = at, at + marks
  at = texts_at + texts
  if not skipped[shard] then
    if band(flags, TEXT_SET) ~= 0 then
      redis_call('SET', text, text_value)
    elseif band(flags, TEXT_APPEND) ~= 0 then
      redis_call('APPEND', text, text_value)
    end
    many('HSET', text_state, texts_at, texts)
    if band(flags, TEXT_FORGET) ~= 0 then
      redis_call('HDEL', text_state, 'id', 'entry')
    end
    if band(flags, TEXT_RENEW) ~= 0 then
      redis_call('EXPIRE', text_state, history_ttl)
      redis_call('EXPIRE', text, history_ttl)
    end
    many('RPUSH', history, payloads, appended)
    if band(flags, STATE_LAST) ~= 0 then
      redis_call('SET', state, ARGV[payloads + appended - 1], 'EX', state_ttl)
    elseif own then
      redis_call('SET', state, own, 'EX', state_ttl)
    elseif band(flags, STATE_RENEW) ~= 0 then
      redis_call('EXPIRE', state, history_ttl)
    end
    many('HSET', markers, marks_at, marks)
    if dropped > 0 then
      redis_call('LTRIM', history, dropped, -1)
    end
    if band(flags, HISTORY_RENEW) ~= 0 then
      redis_call('EXPIRE', history, history_ttl)
    end
    if band(flags, MARKERS_RENEW) ~= 0 then
      redis_call('EXPIRE', markers, markers_ttl)
    end
  end
end
return { fenced, gaps, redis_call('TIME'), {}, {} }
