"""What an HS256 signing secret must be, named apart from the token code so the settings
check a secret without importing PyJWT."""

# HS256 signs with SHA-256: a shorter key is weaker than the hash (RFC 7518, section 3.2).
MIN_SECRET_BYTES = 32
