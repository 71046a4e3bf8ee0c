"""eco-router: routes job-progress events from Redis Streams to per-job Pub/Sub channels."""

__version__ = "0.1.0"
