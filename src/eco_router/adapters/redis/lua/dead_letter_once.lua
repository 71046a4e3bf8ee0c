-- Append each letter to the dead-letter stream unless its entry was dead-lettered already.
-- KEYS: the dead-letter stream, then one marker key per letter.
-- ARGV: maxlen, marker TTL in ms, then per letter: its field count n, then n/2 name-value
-- pairs. Returns the number of letters appended.
local appended = 0
local at = 3
for i = 2, #KEYS do
  local n = tonumber(ARGV[at])
  if redis.call('SET', KEYS[i], '1', 'NX', 'PX', ARGV[2]) then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, at + 1, at + n))
    appended = appended + 1
  end
  at = at + n + 1
end
return appended
