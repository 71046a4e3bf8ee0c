-- Judge a batch of events and apply the NEW ones, atomically.
-- KEYS: per job, three keys: state, history, applied-markers hash (fields: seq -> id of the
--       entry that applied it, plus "last" -> newest applied seq).
-- ARGV: state_ttl_s, markers_ttl_s, history_size, then per event four values:
--       job index (1-based into the key triples), seq, entry id, payload.
--       A job's events arrive in seq order; jobs may interleave.
-- Returns one character per event: "0" new and applied, "1" new but applied earlier by this
-- same entry (publish again), "2" duplicate, "3" stale.
-- Work is grouped per job (one HMGET, one RPUSH, one HSET, ...) so a job's cost does not
-- grow with the number of its events in the batch.
local state_ttl = ARGV[1]
local markers_ttl = ARGV[2]
local history_size = tonumber(ARGV[3])

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
for i = 4, #ARGV, 4 do
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
for _, job in ipairs(jobs) do
  local offsets = offsets_of[job]
  local markers = KEYS[job * 3]
  local fields = { 'last' }
  for n, i in ipairs(offsets) do
    fields[n + 1] = ARGV[i + 1]
  end
  local known = call_chunked('HMGET', markers, fields)
  local last = known[1] or '-1'
  local last_n = tonumber(last)
  local applied_by = {}
  for n, i in ipairs(offsets) do
    if known[n + 1] then
      applied_by[ARGV[i + 1]] = known[n + 1]
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
    elseif by then
      code = '2'
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
    codes[(i - 4) / 4 + 1] = code
  end

  if #payloads > 0 then
    local history = KEYS[job * 3 - 1]
    redis.call('SET', KEYS[job * 3 - 2], payloads[#payloads], 'EX', state_ttl)
    local length = call_chunked('RPUSH', history, payloads)
    if length > history_size then
      redis.call('LTRIM', history, -history_size, -1)
    end
    redis.call('EXPIRE', history, state_ttl)
    -- `last` stays the seq's own string: Lua would print a large number in exponent form.
    marks[#marks + 1] = 'last'
    marks[#marks + 1] = last
    call_chunked('HSET', markers, marks)
    redis.call('EXPIRE', markers, markers_ttl)
  end
end

return table.concat(codes)
