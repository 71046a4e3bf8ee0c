-- Jobs whose older entries other consumers still hold, per stream, so a batch of newer entries
-- can wait for them instead of overtaking them.
-- KEYS: streams. ARGV: group, this consumer, max idle ms, then per stream the id of the batch's
-- first entry there (only entries before it are looked at).
-- Returns one list of job ids per stream. An entry idle for max idle ms or more is ignored:
-- its consumer is stuck or gone, and the reclaimer will bring it back.
local group, me, max_idle = ARGV[1], ARGV[2], tonumber(ARGV[3])
local result = {}
for i, stream in ipairs(KEYS) do
  local jobs = {}
  local ok, pending = pcall(redis.call, 'XPENDING', stream, group, '-', '(' .. ARGV[3 + i], 100)
  if ok then
    for _, entry in ipairs(pending) do
      if entry[2] ~= me and tonumber(entry[3]) < max_idle then
        local found = redis.call('XRANGE', stream, entry[1], entry[1])
        local fields = found[1] and found[1][2] or {}
        for f = 1, #fields, 2 do
          if fields[f] == 'job_id' then
            jobs[#jobs + 1] = fields[f + 1]
            break
          end
        end
      end
    end
  end
  result[i] = jobs
end
return result
