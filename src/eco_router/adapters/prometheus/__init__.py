"""Prometheus adapter of the metrics port."""
