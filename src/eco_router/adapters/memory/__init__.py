"""In-memory adapters with real behaviour, for tests and for running without Redis."""
