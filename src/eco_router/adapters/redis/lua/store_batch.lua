-- Store a batch's writes, as `domain.settle` decided them, atomically, on the shards whose
-- fencing token still holds and whose read came in order. Nothing is judged here.
-- KEYS: the fencing epoch of each shard written, then each one's stream, then every key the
--       writes name.
-- ARGV: the consumer group, the number of shards, per shard one value: its token, followed,
--       when there is a read to check, by " (<after> <first> <consumer>": where the read
--       began (exclusive), the first entry it brought and the consumer that read it; then
--       one value holding every write's line, "<shard> <command> <key> <count> <at>\n" (the
--       shard's and the key's 1-based indices; the write's `count` arguments are the values
--       from the `at`-th on, counted from 0), then one value naming the keys the caller
--       assumed absent ("<key> <key> ..."), then the values. Lines may share values (a
--       payload pushed to the history and set as the state is sent once).
-- Returns {fenced shards, gap shards, TIME, present keys}: the 1-based indices of the shards
-- whose token is no longer the caller's, then of those where an entry another consumer read
-- (or a read whose reply was lost) comes before the read's first (their writes are left out),
-- the server's time, from which the caller knows when the next TTL renewals are due, and the
-- keys assumed absent that exist: when there is one, nothing is written.
local redis_call, tonumber, unpack = redis.call, tonumber, unpack
local group = ARGV[1]
local shards = tonumber(ARGV[2])
-- Only the commands a job's write is made of: anything else is a bug in the caller.
local WRITES = { ['SET'] = true, ['APPEND'] = true, ['RPUSH'] = true, ['LTRIM'] = true,
  ['HSET'] = true, ['HDEL'] = true, ['EXPIRE'] = true }

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

-- Every line is checked before anything is written: a script's writes are not undone.
local lines = {}
local pattern = '(%d+) (%u+) (%d+) (%d+) (%d+)\n'
for shard, command, key, count, at in string.gmatch(ARGV[shards + 3], pattern) do
  if not WRITES[command] then
    return redis.error_reply('store_batch: not a write: ' .. command)
  end
  lines[#lines + 1] = { tonumber(shard), command, tonumber(key), tonumber(count), tonumber(at) }
end
-- A job the caller has not read is assumed new: if one exists after all, the caller reads it
-- and settles the batch again.
local assumed = {}
for key in string.gmatch(ARGV[shards + 4], '%d+') do
  assumed[#assumed + 1] = KEYS[tonumber(key)]
end
for at = 1, #assumed, 1000 do
  if redis_call('EXISTS', unpack(assumed, at, math.min(at + 999, #assumed))) > 0 then
    local present = {}
    for key in string.gmatch(ARGV[shards + 4], '%d+') do
      if redis_call('EXISTS', KEYS[tonumber(key)]) == 1 then
        present[#present + 1] = tonumber(key)
      end
    end
    return { fenced, gaps, redis_call('TIME'), present }
  end
end
local values = shards + 5
for _, line in ipairs(lines) do
  if not skipped[line[1]] then
    local at = values + line[5]
    redis_call(line[2], KEYS[line[3]], unpack(ARGV, at, at + line[4] - 1))
  end
end
return { fenced, gaps, redis_call('TIME'), {} }
