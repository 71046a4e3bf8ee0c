-- Judge a batch of events and apply the NEW ones, atomically.
-- KEYS: per job, three keys: state, history, applied-markers hash (fields: seq -> entry id,
--       plus "last" -> newest applied seq).
-- ARGV: state_ttl_s, markers_ttl_s, history_size, then per event four values:
--       job index (1-based into the key triples), seq, entry id, payload.
-- Returns one character per event: "0" new and applied, "1" new but applied earlier by this
-- same entry (publish again), "2" duplicate, "3" stale.
local state_ttl = tonumber(ARGV[1])
local markers_ttl = tonumber(ARGV[2])
local history_size = tonumber(ARGV[3])

local last_seq = {}
local newest_payload = {}
local codes = {}

for i = 4, #ARGV, 4 do
  local job = tonumber(ARGV[i])
  local seq = ARGV[i + 1]
  local entry_id = ARGV[i + 2]
  local markers = KEYS[job * 3]
  local code
  local applied_by = redis.call('HGET', markers, seq)
  if applied_by == entry_id then
    code = '1'
  elseif applied_by then
    code = '2'
  else
    local last = last_seq[job]
    if last == nil then
      last = tonumber(redis.call('HGET', markers, 'last') or '-1')
    end
    local n = tonumber(seq)
    if n <= last then
      code = '3'
    else
      redis.call('RPUSH', KEYS[job * 3 - 1], ARGV[i + 3])
      redis.call('HSET', markers, seq, entry_id)
      last = n
      newest_payload[job] = ARGV[i + 3]
      code = '0'
    end
    last_seq[job] = last
  end
  codes[#codes + 1] = code
end

for job, payload in pairs(newest_payload) do
  local history = KEYS[job * 3 - 1]
  local markers = KEYS[job * 3]
  redis.call('SET', KEYS[job * 3 - 2], payload, 'EX', state_ttl)
  redis.call('LTRIM', history, -history_size, -1)
  redis.call('EXPIRE', history, state_ttl)
  redis.call('HSET', markers, 'last', last_seq[job])
  redis.call('EXPIRE', markers, markers_ttl)
end

return table.concat(codes)
