"""Redis adapters, by the side they serve: `connections/` (topologies and the machinery every
client shares), `router/`, `gateway/` and `producer/`; the key layout, the Lua scripts, error
translation and the control store (written by the gateway, read by workers and the console)
stay here, shared by several sides."""
