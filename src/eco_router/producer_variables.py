"""The environment variables the producer SDK reads (`eco_router.producer`), named apart from
it so the router's settings can tell them from its own without importing the SDK."""

DOMAIN_VARIABLE = "EVENT_ROUTER_PRODUCER_DOMAIN"
SHARDS_VARIABLE = "EVENT_ROUTER_PRODUCER_SHARDS"
# The reference design's producers read their shard count from this one.
REFERENCE_SHARDS_VARIABLE = "SSE_SHARD_COUNT"
