"""The producer's side: idempotent, sharded appends of progress events and tokens."""
