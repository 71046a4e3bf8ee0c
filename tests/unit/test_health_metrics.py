"""The gauges an alert reads: readiness as `/ready` answered it, and a failing Pub/Sub feed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from eco_router.adapters.prometheus.gateway_metrics import PrometheusGatewayMetrics
from eco_router.adapters.prometheus.readiness_metrics import PrometheusReadinessMetrics


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


class TestReadinessGauges:
    def test_a_passing_check_sets_ready_and_no_check_failing(self) -> None:
        registry = CollectorRegistry()

        PrometheusReadinessMetrics(registry).readiness_checked({"streams": "ok", "pubsub": "ok"})

        assert sample(registry, "event_router_ready") == 1
        assert sample(registry, "event_router_readiness_failing", check="pubsub") == 0

    def test_a_failing_check_clears_ready_and_is_named(self) -> None:
        registry = CollectorRegistry()

        PrometheusReadinessMetrics(registry).readiness_checked(
            {"streams": "ok", "pubsub": "unreachable: connection refused"}
        )

        assert sample(registry, "event_router_ready") == 0
        assert sample(registry, "event_router_readiness_failing", check="pubsub") == 1
        assert sample(registry, "event_router_readiness_failing", check="streams") == 0

    def test_a_check_that_is_gone_no_longer_counts_as_failing(self) -> None:
        registry = CollectorRegistry()
        metrics = PrometheusReadinessMetrics(registry)
        shard = "shard scan:events:2"
        metrics.readiness_checked({"streams": "ok", shard: "quarantined: WRONGTYPE"})

        metrics.readiness_checked({"streams": "ok"})

        assert sample(registry, "event_router_ready") == 1
        assert sample(registry, "event_router_readiness_failing", check=shard) == 0


class TestFeedFailingGauge:
    def test_it_is_1_from_a_failure_until_the_feed_recovers(self) -> None:
        registry = CollectorRegistry()
        metrics = PrometheusGatewayMetrics(registry)
        before = sample(registry, "event_router_gateway_feed_failing")

        metrics.feed_failed()
        during = sample(registry, "event_router_gateway_feed_failing")
        metrics.feed_recovered()

        assert (before, during) == (0, 1)
        assert sample(registry, "event_router_gateway_feed_failing") == 0
        assert sample(registry, "event_router_gateway_feed_failures_total") == 1
