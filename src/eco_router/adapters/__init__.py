"""Adapters: Redis, in-memory and Prometheus implementations of the ports."""
