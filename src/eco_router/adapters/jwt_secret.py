"""What an HS256 signing secret must be, and how long a token it checks may be, named apart
from the token code so the settings check them without importing PyJWT."""

# HS256 signs with SHA-256: a shorter key is weaker than the hash (RFC 7518, section 3.2).
MIN_SECRET_BYTES = 32
# The longest token decoded by default: room for a few hundred job ids. A longer one is
# refused before its signature is checked or its claims parsed, work that grows with its size.
MAX_TOKEN_BYTES = 8 * 1024
