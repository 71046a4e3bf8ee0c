"""prometheus-client adapter of `GatewayMetrics`, in the `event_router_gateway_` family."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from eco_router.application.ports import GatewayMetrics
from eco_router.application.presence import ViewerTally

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class PrometheusGatewayMetrics(GatewayMetrics):
    """Registers the gateway's metrics on `registry`, with its viewer gauges when given the
    process's `viewers`."""

    def __init__(self, registry: CollectorRegistry, viewers: ViewerTally | None = None) -> None:
        if viewers is not None:
            registry.register(ViewerGauges(viewers))
        self._active = Gauge(
            "event_router_gateway_connections_active",
            "SSE connections open now.",
            registry=registry,
        )
        self._opened = Counter(
            "event_router_gateway_connections_opened",
            "SSE connections opened.",
            registry=registry,
        )
        self._closed = Counter(
            "event_router_gateway_connections_closed",
            "SSE connections closed by reason: done, failed, idle, timeout, disconnect, shutdown, "
            "error.",
            ["reason"],
            registry=registry,
        )
        self._sent = Counter(
            "event_router_gateway_events_sent",
            "Events written to clients, live or replayed from the history.",
            ["source"],
            registry=registry,
        )
        # Bound once: a label lookup (a lock and a dict) per event and viewer adds up.
        self._sent_live = self._sent.labels("live")
        self._sent_replay = self._sent.labels("replay")
        self._snapshots = Counter(
            "event_router_gateway_snapshots_sent",
            "Snapshots sent because a client may have missed events.",
            registry=registry,
        )
        self._dropped = Counter(
            "event_router_gateway_events_dropped",
            "Events dropped from slow clients' queues (they catch up from the history).",
            registry=registry,
        )
        self._overtaken = Counter(
            "event_router_gateway_events_overtaken",
            "Live events not sent because a newer seq of the job reached the client first.",
            registry=registry,
        )
        self._feed_failures = Counter(
            "event_router_gateway_feed_failures",
            "Episodes of the Pub/Sub reader that feeds the SSE streams lost or failing.",
            registry=registry,
        )
        self._feed_failing = Gauge(
            "event_router_gateway_feed_failing",
            "1 while the Pub/Sub reader that feeds the SSE streams cannot deliver, else 0.",
            registry=registry,
        )
        self._latency = Histogram(
            "event_router_gateway_delivery_latency_seconds",
            "Entry written (its id's time) to written to the clients, live events: one "
            "observation per event for the viewers written as it arrives, one per viewer "
            "for those that take it from their queue.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )

    def connection_opened(self) -> None:
        self._opened.inc()
        self._active.inc()

    def connection_closed(self, reason: str) -> None:
        self._closed.labels(reason).inc()
        self._active.dec()

    def events_sent(self, count: int, *, replayed: bool) -> None:
        (self._sent_replay if replayed else self._sent_live).inc(count)

    def snapshot_sent(self) -> None:
        self._snapshots.inc()

    def events_dropped(self, count: int) -> None:
        self._dropped.inc(count)

    def event_overtaken(self) -> None:
        self._overtaken.inc()

    def delivered(self, latency_ms: float) -> None:
        self._latency.observe(latency_ms / 1000)

    def feed_failed(self) -> None:
        self._feed_failures.inc()
        self._feed_failing.set(1)

    def feed_recovered(self) -> None:
        self._feed_failing.set(0)


class ViewerGauges(Collector):
    """Viewers and jobs watched per domain, read from the tally when scraped: nothing is
    updated per stream or per event, and no label names a job (one series per domain)."""

    def __init__(self, viewers: ViewerTally) -> None:
        self._viewers = viewers

    def collect(self) -> Iterator[Metric]:
        streams = GaugeMetricFamily(
            "event_router_gateway_viewers",
            "Job streams (viewers) open now on this gateway, by domain.",
            labels=["domain"],
        )
        jobs = GaugeMetricFamily(
            "event_router_gateway_jobs_watched",
            "Jobs with at least one viewer on this gateway now, by domain.",
            labels=["domain"],
        )
        for domain, (viewers, watched) in sorted(self._viewers.by_domain().items()):
            streams.add_metric([domain], viewers)
            jobs.add_metric([domain], watched)
        yield streams
        yield jobs
