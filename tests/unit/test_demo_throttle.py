"""The demo endpoint's throttle: token buckets per client address and per process."""

from __future__ import annotations

import pytest

from eco_router.entrypoints.http.demo_throttle import Throttle, TokenBucket, requested_jobs


def make_throttle(**overrides: float) -> Throttle:
    limits: dict[str, float] = {
        "rate": 10.0,
        "burst": 10,
        "client_rate": 0.5,
        "client_burst": 3,
    } | overrides
    return Throttle(**limits)  # type: ignore[arg-type]


class TestTokenBucket:
    def test_a_full_bucket_admits_its_burst_then_names_the_wait(self) -> None:
        bucket = TokenBucket.full(rate=2.0, burst=2, now=0.0)
        for _ in range(2):
            assert bucket.wait_s(0.0) == 0
            bucket.take()

        assert bucket.wait_s(0.0) == 0.5
        assert bucket.wait_s(0.5) == 0

    def test_refill_stops_at_the_burst(self) -> None:
        bucket = TokenBucket.full(rate=1.0, burst=2, now=0.0)

        bucket.wait_s(1_000.0)

        assert bucket.tokens == 2


class TestThrottle:
    def test_one_client_gets_its_burst_then_waits_for_a_refill(self) -> None:
        throttle = make_throttle()

        admitted = [throttle.admit("10.0.0.1", 0.0) for _ in range(3)]
        refused = throttle.admit("10.0.0.1", 0.0)

        assert admitted == [0, 0, 0]
        assert refused == 2.0
        assert throttle.admit("10.0.0.1", 2.0) == 0

    def test_another_client_is_not_held_back_by_the_first(self) -> None:
        throttle = make_throttle()
        for _ in range(4):
            throttle.admit("10.0.0.1", 0.0)

        assert throttle.admit("10.0.0.2", 0.0) == 0

    def test_the_process_bucket_bounds_all_clients_together(self) -> None:
        throttle = make_throttle(rate=1.0, burst=2)

        waits = [throttle.admit(f"10.0.0.{n}", 0.0) for n in range(3)]

        assert waits == [0, 0, 1.0]

    def test_a_request_for_several_jobs_is_one_of_its_client_and_many_of_the_process(
        self,
    ) -> None:
        throttle = make_throttle(rate=1.0, burst=20, client_burst=2)

        assert throttle.admit("10.0.0.1", 0.0, jobs=20) == 0
        assert throttle.admit("10.0.0.2", 0.0) == 1.0
        assert throttle.admit("10.0.0.1", 20.0, jobs=20) == 0  # one of its two requests left

    def test_a_refused_request_takes_no_token(self) -> None:
        throttle = make_throttle(rate=1.0, burst=1, client_burst=5)
        throttle.admit("10.0.0.1", 0.0)
        for _ in range(10):
            assert throttle.admit("10.0.0.1", 0.0) > 0

        assert throttle.admit("10.0.0.1", 1.0) == 0

    def test_only_the_most_recent_clients_keep_a_bucket(self) -> None:
        throttle = make_throttle(max_clients=2, client_burst=1)
        throttle.admit("a", 0.0)
        throttle.admit("b", 0.0)
        throttle.admit("c", 0.0)

        assert throttle.admit("b", 0.0) > 0
        assert throttle.admit("a", 0.0) == 0


class TestRequestedJobs:
    @pytest.mark.parametrize(
        ("query", "jobs"),
        [
            (b"", 1),
            (b"count=20", 20),
            (b"count=500", 20),
            (b"count=x", 1),
            (b"count=0", 1),
            (b"count=2&count=3", 1),
            (b"fail=true&count=5", 5),
        ],
    )
    def test_the_count_asked_for_within_the_most_a_request_starts(
        self, query: bytes, jobs: int
    ) -> None:
        assert requested_jobs(query) == jobs
