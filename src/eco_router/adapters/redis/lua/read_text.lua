-- A job's text and what is known of it, read together so they agree.
-- KEYS: the text's hash, the text. Returns {attempt, seq, id, full, node, run_at, runs, bytes,
-- text}, or {} when the job has no text (never a token, or expired).
local known = redis.call('HMGET', KEYS[1], 'attempt', 'seq', 'id', 'full', 'node', 'run_at',
  'runs', 'bytes')
if not known[3] then
  return {}
end
known[9] = redis.call('GET', KEYS[2]) or ''
return known
