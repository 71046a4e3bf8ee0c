-- Judge a batch of events and apply the NEW ones, atomically, on the shards whose fencing
-- token still holds and whose read came in order.
-- KEYS: the fencing epoch of each shard written, then each one's stream, then per job three
--       keys: state, history, applied-markers hash (fields: seq -> id of the entry that
--       applied it, plus "last" -> newest applied seq, "history_bytes" -> the history's
--       total payload bytes and "renewed" -> when the TTLs were last renewed, server time in
--       seconds).
-- ARGV: state_ttl_s, markers_ttl_s, history_size, history_max_bytes, the consumer group,
--       number of shards, then per shard three values: its token, and where its read began
--       (exclusive, "(<id>") and the consumer that read it, or two empty strings when there
--       is no read to check; then the first entry each read brought, one per shard ("" when
--       none); then each job's shard (1-based), then per event four values: job index
--       (1-based into the key triples), seq, entry id, payload. A job's events arrive in seq
--       order; jobs may interleave.
-- Returns {codes, fenced shards, gap shards}: one character per event, "0" new and
-- applied, "1" new but applied earlier by this same entry (publish again), "2" duplicate,
-- "3" stale, "5" new but applied earlier by another entry the stream never held (publish
-- again; the marker moves to this entry), "4" not judged (its shard's token is no longer the caller's, or an entry
-- another consumer read, or a read whose reply was lost, comes before the read's first);
-- and the 1-based indices of the fenced shards, then of the shards with such a gap.
-- Work is grouped per job (one HMGET, one RPUSH, one HSET, ...) so a job's cost does not
-- grow with the number of its events in the batch. The history's and the markers' TTLs are
-- renewed at most once per RENEW_EVERY seconds (and kept that much longer), not per batch:
-- each lives at least its TTL after the job's last event, up to RENEW_EVERY longer.
local state_ttl = ARGV[1]
local markers_ttl = ARGV[2]
local history_size = tonumber(ARGV[3])
local history_max_bytes = tonumber(ARGV[4])
local group = ARGV[5]
local shards = tonumber(ARGV[6])
local RENEW_EVERY = math.min(60, math.floor(tonumber(state_ttl) / 10))
local history_ttl = tonumber(state_ttl) + RENEW_EVERY
local kept_markers_ttl = tonumber(markers_ttl) + RENEW_EVERY
local firsts_at = 6 + shards * 3
local jobs_at = firsts_at + shards
local events_at = jobs_at + (#KEYS - shards * 2) / 3 + 1

local skipped = {}
local fenced_list = {}
local gap_list = {}
for shard = 1, shards do
  local at = 6 + (shard - 1) * 3
  if (redis.call('GET', KEYS[shard]) or '0') ~= ARGV[at + 1] then
    skipped[shard] = true
    fenced_list[#fenced_list + 1] = shard
  elseif ARGV[at + 2] ~= '' then
    -- The first entry pending after where the read began must be the read's own first.
    local reply = redis.pcall('XPENDING', KEYS[shards + shard], group, ARGV[at + 2], '+', 1)
    local first = not reply.err and reply[1]
    if first and (first[1] ~= ARGV[firsts_at + shard] or first[2] ~= ARGV[at + 3]) then
      skipped[shard] = true
      gap_list[#gap_list + 1] = shard
    end
  end
end

-- unpack() is bounded by the Lua stack: spread long argument lists over several calls.
local CHUNK = 1000
-- Returns the concatenated replies of a command answering lists, else the last reply.
local function call_chunked(command, key, values)
  local replies = {}
  local last
  for first = 1, #values, CHUNK do
    last = redis.call(command, key, unpack(values, first, math.min(first + CHUNK - 1, #values)))
    if type(last) == 'table' then
      for _, value in ipairs(last) do
        replies[#replies + 1] = value
      end
    end
  end
  if type(last) == 'table' then
    return replies
  end
  return last
end

local jobs = {}
local offsets_of = {}
for i = events_at, #ARGV, 4 do
  local job = tonumber(ARGV[i])
  local offsets = offsets_of[job]
  if offsets == nil then
    offsets = {}
    offsets_of[job] = offsets
    jobs[#jobs + 1] = job
  end
  offsets[#offsets + 1] = i
end

local codes = {}

local now
-- The server's time in seconds, asked once per call.
local function now_s()
  if now == nil then
    now = tonumber(redis.call('TIME')[1])
  end
  return now
end

-- Stream ids compare as two numbers, milliseconds then sequence.
local function id_after(a, b)
  local a_ms, a_seq = string.match(a, '^(%d+)-(%d+)$')
  local b_ms, b_seq = string.match(b, '^(%d+)-(%d+)$')
  if not a_ms or not b_ms then
    return false
  end
  a_ms, b_ms = tonumber(a_ms), tonumber(b_ms)
  return a_ms > b_ms or (a_ms == b_ms and tonumber(a_seq) > tonumber(b_seq))
end

-- Whether the stream exists and never held entry `id`: it is not there, no entry was ever
-- deleted as far (XDEL), and it is not before the first entry (trimmed). An entry removed
-- after its publish is not lost.
local function never_held(stream, id)
  if #redis.call('XRANGE', stream, id, id) > 0 then
    return false
  end
  local info = redis.pcall('XINFO', 'STREAM', stream)
  if info.err then
    return false
  end
  local deleted, first
  for i = 1, #info, 2 do
    if info[i] == 'max-deleted-entry-id' then
      deleted = info[i + 1]
    elseif info[i] == 'first-entry' then
      first = info[i + 1] and info[i + 1][1]
    end
  end
  return deleted ~= nil and first and id_after(id, deleted) and id_after(id, first) or false
end

-- Judge one job's events (in seq order) and apply the new ones with one call per command.
local function apply_job(job, offsets)
  local base = shards * 2 + job * 3
  local markers = KEYS[base]
  local stream = KEYS[shards + tonumber(ARGV[jobs_at + job])]
  local fields = { 'last', 'history_bytes', 'renewed' }
  for n, i in ipairs(offsets) do
    fields[n + 3] = ARGV[i + 1]
  end
  local known = call_chunked('HMGET', markers, fields)
  local last = known[1] or '-1'
  local last_n = tonumber(last)
  local applied_by = {}
  for n, i in ipairs(offsets) do
    if known[n + 3] then
      applied_by[ARGV[i + 1]] = known[n + 3]
    end
  end

  local payloads = {}
  local marks = {}
  for _, i in ipairs(offsets) do
    local seq = ARGV[i + 1]
    local entry_id = ARGV[i + 2]
    local by = applied_by[seq]
    local code
    if by == entry_id then
      code = '1'
    elseif by and not never_held(stream, by) then
      code = '2'
    elseif by then
      -- Its publish is unconfirmed: it was read from a demoted master whose writes were lost,
      -- after its state write reached the promoted one. Rare (retries only): checked here.
      code = '5'
      applied_by[seq] = entry_id
      marks[#marks + 1] = seq
      marks[#marks + 1] = entry_id
    elseif tonumber(seq) <= last_n then
      code = '3'
    else
      code = '0'
      last, last_n = seq, tonumber(seq)
      applied_by[seq] = entry_id
      payloads[#payloads + 1] = ARGV[i + 3]
      marks[#marks + 1] = seq
      marks[#marks + 1] = entry_id
    end
    codes[(i - events_at) / 4 + 1] = code
  end

  if #payloads > 0 then
    local history = KEYS[base - 1]
    redis.call('SET', KEYS[base - 2], payloads[#payloads], 'EX', state_ttl)
    local bytes = 0
    for _, payload in ipairs(payloads) do
      bytes = bytes + #payload
    end
    local length = call_chunked('RPUSH', history, payloads)
    local created = length == #payloads
    if not created then
      if known[2] then
        bytes = bytes + tonumber(known[2])
      else
        -- A history written before its bytes were counted: count it once.
        bytes = 0
        for _, payload in ipairs(redis.call('LRANGE', history, 0, -1)) do
          bytes = bytes + #payload
        end
      end
    end
    -- Only what is dropped is read, so the cost follows what was appended, not the history.
    if length > history_size then
      local dropped = redis.call('LRANGE', history, 0, length - history_size - 1)
      for _, payload in ipairs(dropped) do
        bytes = bytes - #payload
      end
      redis.call('LTRIM', history, -history_size, -1)
      length = history_size
    end
    -- The newest event always stays, however large: the state names it anyway.
    while bytes > history_max_bytes and length > 1 do
      bytes = bytes - #redis.call('LPOP', history)
      length = length - 1
    end
    local renewed = tonumber(known[3])
    -- A clock that went back (a failover to a replica behind) renews too.
    local due = renewed == nil or now_s() - renewed >= RENEW_EVERY or now_s() < renewed
    if due or created then
      -- A history RPUSH just created has no TTL yet, whenever the markers were renewed.
      redis.call('EXPIRE', history, history_ttl)
    end
    -- `last` stays the seq's own string: Lua would print a large number in exponent form.
    marks[#marks + 1] = 'last'
    marks[#marks + 1] = last
    marks[#marks + 1] = 'history_bytes'
    marks[#marks + 1] = bytes
    if due then
      marks[#marks + 1] = 'renewed'
      marks[#marks + 1] = now_s()
    end
    call_chunked('HSET', markers, marks)
    if due then
      redis.call('EXPIRE', markers, kept_markers_ttl)
    end
  elseif #marks > 0 then
    call_chunked('HSET', markers, marks)
  end
end

for _, job in ipairs(jobs) do
  local offsets = offsets_of[job]
  if skipped[tonumber(ARGV[jobs_at + job])] then
    for _, i in ipairs(offsets) do
      codes[(i - events_at) / 4 + 1] = '4'
    end
  else
    apply_job(job, offsets)
  end
end

return { table.concat(codes), fenced_list, gap_list }
