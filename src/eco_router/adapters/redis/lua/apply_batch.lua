-- Judge a batch of events and apply the NEW ones, atomically, on the shards whose fencing
-- token still holds and whose read came in order.
-- KEYS: the fencing epoch of each shard written, then each one's stream, then per job five
--       keys: state, history, applied-markers hash (fields: seq -> "<id of the entry that
--       applied it> <its stamp>", plus "last" -> newest applied stage seq, "last_id" ->
--       newest event id given, "history_bytes" -> the history's total payload bytes,
--       "renewed" -> when the TTLs were last renewed, server time in seconds, and "ended" ->
--       "1" when the newest applied stage event ends the job, "2" when a token came after
--       that end too, "0" or none when it does not end it), the text's
--       hash (attempt, seq and id and entry of its last token, bytes, full, the node of the
--       run being written and where it began, the closed runs "node\tstart\tend\n"...) and
--       the text itself.
-- ARGV: state_ttl_s, markers_ttl_s, history_size, history_max_bytes, the consumer group,
--       text_max_bytes, number of shards, then per shard one value: its token, followed,
--       when there is a read to check, by " (<id> <first> <consumer>": where the read began
--       (exclusive), the first entry it brought and the consumer that read it; then each
--       job's shard (1-based); then one value holding every event's line, each ending in a
--       newline: "<job index> <kind> <seq> <entry id>" (a token's: "... <attempt> <node>",
--       the node "" when none); then one value per event, in the lines' order: the payload
--       without its opening brace (a stage or lifecycle event), or the content (a token).
--       The job index is 1-based into the key quintuples; the kind is "s" a stage event, "e"
--       a terminal one, "t" a token, "l" a lifecycle event, whose seq is its marker's name
--       "<stage>:<seq>". The fields travel in one value, not one per field: the server and
--       the client handle a fraction of the arguments, and the payload comes as its own
--       value, ready to follow a stamp, so that the script copies it once. A job's events
--       arrive in judging order (each kind in seq order); jobs may interleave. A lifecycle
--       event is judged by its marker alone (never stale, making nothing stale), goes to
--       the history with the next event id and leaves the state (the latest stage event) as
--       it was.
-- Returns {codes, fenced shards, gap shards, stamps}: one character per event, "0" new and
-- applied, "1" new but applied earlier by this same entry (publish again), "2" duplicate,
-- "3" stale, "5" new but applied earlier by another entry the stream never held (publish
-- again; the marker moves to this entry), "6" a token that restarts the text (a newer
-- attempt), "7" a token that does not fit in a full text, "8" the token that filled it
-- ("9": and restarted it), "a" the first token after the job's end (stale, like the later
-- ones: "3"; a token at or below the last seq stays a duplicate), "4" not judged (its
-- shard's token is no longer the caller's, or an entry another consumer read, or a read
-- whose reply was lost, comes before the read's first); the 1-based indices of the fenced
-- shards, then of the shards with such a gap; and per event the fields to put first in its
-- JSON when it is published ("" when it is not): its event id, the id before it, and a
-- restart flag or the text's check.
-- Work is grouped per job (one HMGET, one RPUSH, one HSET, one APPEND, ...) so a job's cost
-- does not grow with the number of its events in the batch. The TTLs are renewed at most
-- once per RENEW_EVERY seconds (and kept that much longer), not per batch: each key lives
-- at least its TTL after the job's last event, up to RENEW_EVERY longer.
-- Much of the server's cost is the interpreter's own: every string made is hashed and
-- interned, every table allocated and later swept. So the common path makes as few of
-- either as it can: scratch tables reused from job to job, numbers kept beside their text
-- instead of formatted again, one string per stamp.
-- The library functions the script calls most, as locals: a global is a table lookup by name
-- at each use.
local match, format, concat = string.match, string.format, table.concat
local redis_call, tonumber, unpack = redis.call, tonumber, unpack
local state_ttl = ARGV[1]
local markers_ttl = ARGV[2]
local history_size = tonumber(ARGV[3])
local history_max_bytes = tonumber(ARGV[4])
local group = ARGV[5]
local text_max_bytes = tonumber(ARGV[6])
local shards = tonumber(ARGV[7])
local RENEW_EVERY = math.min(60, math.floor(tonumber(state_ttl) / 10))
-- Numbers given to redis.call as strings: Lua would format each one again per call.
local history_ttl = format('%d', tonumber(state_ttl) + RENEW_EVERY)
local kept_markers_ttl = format('%d', tonumber(markers_ttl) + RENEW_EVERY)
local PER_JOB = 5
local jobs_at = 7 + shards
local lines_at = jobs_at + (#KEYS - shards * 2) / PER_JOB + 1

local skipped = {}
local fenced_list = {}
local gap_list = {}
-- One MGET for every shard's epoch: a command per shard costs more than the check itself.
local epochs = redis_call('MGET', unpack(KEYS, 1, shards))
for shard = 1, shards do
  local given = ARGV[7 + shard]
  local token, after, read_first, consumer = match(given, '^(%S+) (%S+) (%S+) (.*)$')
  if (epochs[shard] or '0') ~= (token or given) then
    skipped[shard] = true
    fenced_list[#fenced_list + 1] = shard
  elseif token then
    -- The first entry pending after where the read began must be the read's own first.
    local reply = redis.pcall('XPENDING', KEYS[shards + shard], group, after, '+', 1)
    local first = not reply.err and reply[1]
    if first and (first[1] ~= read_first or first[2] ~= consumer) then
      skipped[shard] = true
      gap_list[#gap_list + 1] = shard
    end
  end
end

-- unpack() is bounded by the Lua stack: spread long argument lists over several calls.
local CHUNK = 1000
-- The first `count` values of `values` as arguments of `command` on `key`: the concatenated
-- replies of a command answering lists, else the last reply.
local function call(command, key, values, count)
  if count <= CHUNK then
    return redis_call(command, key, unpack(values, 1, count))
  end
  local replies = {}
  local last
  for first = 1, count, CHUNK do
    last = redis_call(command, key, unpack(values, first, math.min(first + CHUNK - 1, count)))
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

-- Per event (numbered from 1 in the batch's order): its fields (a token's attempt and node
-- too) and the next event of its job; per job (by its index as given): its first and last
-- event.
local seq_of, entry_of, kind_of, attempt_of, node_of, next_of = {}, {}, {}, {}, {}, {}
local first_of, last_of = {}, {}
local jobs = {}
local lines = ARGV[lines_at]
local at = 1
for n = 1, #ARGV - lines_at do
  local job, kind, seq, entry, after = match(lines, '^(%d+) (%a) (%S+) (%S+)()', at)
  seq_of[n], entry_of[n], kind_of[n] = seq, entry, kind
  if kind == 't' then
    attempt_of[n], node_of[n], at = match(lines, '^ (%d+) (%S*)\n()', after)
  else
    at = after + 1
  end
  -- The index's text keys the job: no number is read per event.
  local last = last_of[job]
  if last == nil then
    first_of[job] = n
    jobs[#jobs + 1] = job
  else
    next_of[last] = n
  end
  last_of[job] = n
end

local codes = {}
local stamps = {}

local now, now_text
-- The server's time in seconds, asked once per call.
local function now_s()
  if now == nil then
    now_text = redis_call('TIME')[1]
    now = tonumber(now_text)
  end
  return now
end

-- Stream ids compare as two numbers, milliseconds then sequence.
local function id_after(a, b)
  local a_ms, a_seq = match(a, '^(%d+)-(%d+)$')
  local b_ms, b_seq = match(b, '^(%d+)-(%d+)$')
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
  if #redis_call('XRANGE', stream, id, id) > 0 then
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

-- Integers as Lua prints them without an exponent (ids stay below 2^53).
local function int(n)
  return format('%d', n)
end

-- The fields put first in an event's JSON, as one string: its id, the job's id before it
-- (none for the job's first) and `extra`.
local function stamp_of(id, prev, extra)
  if prev == nil then
    return '"event_id":' .. id .. ',' .. extra
  end
  return '"event_id":' .. id .. ',"prev_event_id":' .. prev .. ',' .. extra
end

-- Writes the tokens appended so far, so that a check of the text sees them.
local function flush_text(text, text_key)
  if text.reset then
    redis_call('SET', text_key, concat(text.parts), 'EX', state_ttl)
    text.reset = false
  elseif #text.parts > 0 then
    redis_call('APPEND', text_key, concat(text.parts))
  end
  text.parts = {}
end

-- Arguments of the job's HMGET, RPUSH and HSET, reused from job to job (a count goes with
-- each): a table made and swept per job costs more than its commands' arguments.
local fields, payloads, marks = {}, {}, {}
-- Per event: its field in the job's HMGET.
local field_of = {}

-- Judge one job's events (from its first, `n`, read from `stream`) and apply the new ones
-- with one call per command.
local function apply_job(job, n, stream)
  local base = shards * 2 + (job - 1) * PER_JOB
  local state_key, history, markers = KEYS[base + 1], KEYS[base + 2], KEYS[base + 3]
  local text_state_key, text_key = KEYS[base + 4], KEYS[base + 5]
  fields[1], fields[2], fields[3], fields[4] = 'last', 'history_bytes', 'renewed', 'last_id'
  fields[5] = 'ended'
  local field_count = 5
  local with_text = false
  local at = n
  while at do
    local kind = kind_of[at]
    if kind == 't' or kind == 'e' then
      with_text = true
    end
    if kind ~= 't' then
      field_count = field_count + 1
      fields[field_count] = seq_of[at]
      field_of[at] = field_count
    end
    at = next_of[at]
  end
  local known = call('HMGET', markers, fields, field_count)
  local last = known[1] or '-1'
  local last_n = tonumber(last)
  -- The job's last event id, and its text as written (ids are written as Lua prints them).
  -- Before event ids, an event's id was its seq.
  local known_id = tonumber(known[4])
  local last_id_text = known[4] or known[1] or nil
  local last_id = known_id or (known[1] and last_n) or nil
  -- Whether the job has ended ("0" no, "1" yes, "2" and a token came after), as the batch
  -- goes on: read once, a string compared per token.
  local known_ended = known[5] or '0'
  local ended = known_ended
  -- The markers given by this batch's events, when another one of the job's may look.
  local given = field_count > 6 and {} or nil

  local text
  if with_text then
    local t = redis_call('HMGET', text_state_key, 'attempt', 'seq', 'bytes', 'full', 'node',
      'run_at', 'runs')
    text = {
      attempt = tonumber(t[1]),
      seq = tonumber(t[2]) or -1,
      bytes = tonumber(t[3]) or 0,
      full = t[4] == '1',
      node = t[5] or '',
      run_at = tonumber(t[6]) or 0,
      runs = t[7] or '',
      -- HMGET gives false, not nil, for a field that is not there.
      created = not t[1],
      parts = {},
      reset = false,
    }
  end
  local restarted = false
  local text_changed = false

  local payload_count, mark_count, bytes = 0, 0, 0
  local state_payload
  while n do
    local seq = seq_of[n]
    local entry_id = entry_of[n]
    local kind = kind_of[n]
    -- The payload without its opening brace, or the token's content.
    local body = ARGV[lines_at + n]
    local code
    if kind == 't' then
      local attempt = tonumber(attempt_of[n])
      local node = node_of[n]
      local content = body
      local seq_n = tonumber(seq)
      local restarts = text.attempt ~= nil and attempt > text.attempt
      if text.attempt ~= nil and attempt < text.attempt then
        code = '3'
      elseif ended ~= '0' and (attempt ~= text.attempt or seq_n > text.seq) then
        -- After the job's end the text is as the end left it (`judge_token`).
        if ended == '1' then
          code, ended = 'a', '2'
        else
          code = '3'
        end
      else
        if restarts or text.attempt == nil then
          if restarts then
            text.seq, text.bytes, text.full = -1, 0, false
            text.node, text.run_at, text.runs = '', 0, ''
            text.id, text.entry = nil, nil
            text.parts, text.reset, restarted = {}, true, true
          end
          text.attempt = attempt
          text_changed = true
        end
        if seq_n <= text.seq then
          code = '2'
        elseif text.full then
          code = '7'
        elseif text.bytes + #content > text_max_bytes then
          code = restarts and '9' or '8'
          text.full = true
        else
          code = restarts and '6' or '0'
          local id, id_text = seq_n, seq
          if last_id ~= nil and seq_n <= last_id then
            id = last_id + 1
            id_text = int(id)
          end
          stamps[n] = stamp_of(id_text, last_id_text, restarts and '"restart":true,' or '')
          last_id, last_id_text = id, id_text
          if node ~= text.node then
            if text.node ~= '' and text.bytes > text.run_at then
              text.runs = text.runs .. text.node .. '\t' .. int(text.run_at) .. '\t'
                .. int(text.bytes) .. '\n'
            end
            text.node, text.run_at = node, text.bytes
          end
          text.parts[#text.parts + 1] = content
          text.bytes = text.bytes + #content
          text.seq = seq_n
          text.id = id
          text.entry = entry_id
        end
        text_changed = true
      end
    else
      local marker = given and given[seq]
      if marker == nil then
        marker = known[field_of[n]]
      end
      local by, stamp
      if marker then
        by, stamp = match(marker, '^(%S+) (.*)$')
        if by == nil then
          -- A marker written before stamps: the entry alone, and its seq was its id.
          by, stamp = marker, '"event_id":' .. seq .. ','
        end
      end
      if by == entry_id then
        code = '1'
        stamps[n] = stamp
      elseif by and not never_held(stream, by) then
        code = '2'
      elseif by then
        -- Its publish is unconfirmed: it was read from a demoted master whose writes were
        -- lost, after its state write reached the promoted one. Rare (retries only).
        code = '5'
        stamps[n] = stamp
        marker = entry_id .. ' ' .. stamp
        if given then
          given[seq] = marker
        end
        marks[mark_count + 1], marks[mark_count + 2] = seq, marker
        mark_count = mark_count + 2
      else
        local seq_n = kind ~= 'l' and tonumber(seq)
        if seq_n and seq_n <= last_n then
          code = '3'
        else
          code = '0'
          local id, id_text, extra
          if not seq_n then
            -- A lifecycle event takes the id after the job's last.
            id = last_id and last_id + 1 or 0
            id_text = int(id)
            extra = ''
          else
            last, last_n = seq, seq_n
            ended = kind == 'e' and '1' or '0'
            id, id_text = seq_n, seq
            if last_id ~= nil and seq_n <= last_id then
              id = last_id + 1
              id_text = int(id)
            end
            extra = ''
            if kind == 'e' and text.attempt ~= nil then
              flush_text(text, text_key)
              local whole = redis_call('GET', text_key) or ''
              extra = '"text_check":{"bytes":' .. #whole .. ',"sha1":"'
                .. redis.sha1hex(whole) .. '","truncated":' .. (text.full and 'true' or 'false')
                .. '},'
            end
          end
          stamp = stamp_of(id_text, last_id_text, extra)
          last_id, last_id_text = id, id_text
          stamps[n] = stamp
          local payload = '{' .. stamp .. body
          payload_count = payload_count + 1
          payloads[payload_count] = payload
          bytes = bytes + #payload
          if seq_n then
            state_payload = payload
          end
          marker = entry_id .. ' ' .. stamp
          if given then
            given[seq] = marker
          end
          marks[mark_count + 1], marks[mark_count + 2] = seq, marker
          mark_count = mark_count + 2
        end
      end
    end
    codes[n] = code
    n = next_of[n]
  end

  local renewed = tonumber(known[3])
  -- A clock that went back (a failover to a replica behind) renews too.
  local due = renewed == nil or now_s() - renewed >= RENEW_EVERY or now_s() < renewed

  if text_changed then
    flush_text(text, text_key)
    local t = { 'attempt', int(text.attempt), 'seq', int(text.seq), 'bytes', int(text.bytes),
      'full', text.full and '1' or '0', 'node', text.node, 'run_at', int(text.run_at),
      'runs', text.runs }
    if text.id then
      t[#t + 1] = 'id'
      t[#t + 1] = int(text.id)
      t[#t + 1] = 'entry'
      t[#t + 1] = text.entry
    end
    redis_call('HSET', text_state_key, unpack(t))
    if restarted and not text.id then
      -- No token of the new attempt was written: the old attempt's last one is not its.
      redis_call('HDEL', text_state_key, 'id', 'entry')
    end
    -- A text written anew expires with its hash: a hash without its text would count bytes
    -- the text no longer has.
    if due or text.created or restarted then
      redis_call('EXPIRE', text_state_key, history_ttl)
      redis_call('EXPIRE', text_key, history_ttl)
    end
  end

  if state_payload then
    redis_call('SET', state_key, state_payload, 'EX', state_ttl)
  elseif payload_count > 0 and due then
    -- Lifecycle events alone: the state stays, and lives as long as the history.
    redis_call('EXPIRE', state_key, history_ttl)
  end
  if payload_count > 0 then
    local length = call('RPUSH', history, payloads, payload_count)
    local created = length == payload_count
    if not created then
      if known[2] then
        bytes = bytes + tonumber(known[2])
      else
        -- A history written before its bytes were counted: count it once.
        bytes = 0
        for _, payload in ipairs(redis_call('LRANGE', history, 0, -1)) do
          bytes = bytes + #payload
        end
      end
    end
    -- Only what is dropped is read, so the cost follows what was appended, not the history.
    if length > history_size then
      local dropped = redis_call('LRANGE', history, 0, length - history_size - 1)
      for _, payload in ipairs(dropped) do
        bytes = bytes - #payload
      end
      redis_call('LTRIM', history, -history_size, -1)
      length = history_size
    end
    -- The newest event always stays, however large: the state names it anyway.
    while bytes > history_max_bytes and length > 1 do
      bytes = bytes - #redis_call('LPOP', history)
      length = length - 1
    end
    if due or created then
      -- A history RPUSH just created has no TTL yet, whenever the markers were renewed.
      redis_call('EXPIRE', history, history_ttl)
    end
    -- `last` stays the seq's own string: Lua would print a large number in exponent form.
    marks[mark_count + 1], marks[mark_count + 2] = 'last', last
    marks[mark_count + 3], marks[mark_count + 4] = 'history_bytes', int(bytes)
    mark_count = mark_count + 4
  end
  if last_id ~= nil and last_id ~= known_id then
    marks[mark_count + 1], marks[mark_count + 2] = 'last_id', last_id_text
    mark_count = mark_count + 2
  end
  if ended ~= known_ended then
    marks[mark_count + 1], marks[mark_count + 2] = 'ended', ended
    mark_count = mark_count + 2
  end
  if mark_count > 0 then
    if due then
      now_s()
      marks[mark_count + 1], marks[mark_count + 2] = 'renewed', now_text
      mark_count = mark_count + 2
    end
    call('HSET', markers, marks, mark_count)
    if due then
      redis_call('EXPIRE', markers, kept_markers_ttl)
      -- Stage events and tokens share the renewal: the keys of the kind that did not come
      -- are renewed with it, or they would expire while the job goes on.
      if payload_count == 0 then
        redis_call('EXPIRE', history, history_ttl)
      end
      -- A text exists only with its hash (both expire at the same moment): a job without
      -- one (most) costs one command.
      if not text_changed and redis_call('EXPIRE', text_state_key, history_ttl) == 1 then
        redis_call('EXPIRE', text_key, history_ttl)
      end
    end
  end
end

for _, job in ipairs(jobs) do
  local n = first_of[job]
  job = tonumber(job)
  local shard = tonumber(ARGV[jobs_at + job])
  if skipped[shard] then
    while n do
      codes[n] = '4'
      n = next_of[n]
    end
  else
    apply_job(job, n, KEYS[shards + shard])
  end
end

for n = 1, #codes do
  stamps[n] = stamps[n] or ''
end
return { concat(codes), fenced_list, gap_list, stamps }
