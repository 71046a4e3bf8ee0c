"""Redis adapters: streams source, Lua state store, Pub/Sub broadcaster, dead letters."""
