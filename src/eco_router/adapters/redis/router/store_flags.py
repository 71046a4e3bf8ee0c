"""The flags of one job's part of a `store_batch.lua` call: which of its keys it names and which
writes it makes besides appending its payloads and setting its markers and text state."""

# The job's text state and text keys follow its state, history and markers keys.
TEXT_KEYS = 1
# The text is set to (restarted with) the value given, or the value is appended to it.
TEXT_SET = 2
TEXT_APPEND = 4
# The text state forgets its last token (id, entry): the attempt's own has yet to come.
TEXT_FORGET = 8
TEXT_RENEW = 16
# The state is the last payload appended, or its own value given.
STATE_LAST = 32
STATE_OWN = 64
STATE_RENEW = 128
HISTORY_RENEW = 256
MARKERS_RENEW = 512
# Any of which needs the text keys.
TEXT_WRITES = TEXT_SET | TEXT_APPEND | TEXT_FORGET | TEXT_RENEW
