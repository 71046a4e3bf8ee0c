"""Bounded exponential back-off."""

from __future__ import annotations

import pytest

from eco_router.application.backoff import Backoff


class TestBackoff:
    def test_delays_double_up_to_the_cap(self) -> None:
        backoff = Backoff(initial_s=0.1, max_s=1.0, jitter=0.0)

        delays = [backoff.next_delay() for _ in range(7)]

        assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])

    def test_reset_starts_again_from_the_initial_delay(self) -> None:
        backoff = Backoff(initial_s=0.1, max_s=1.0, jitter=0.0)
        for _ in range(4):
            backoff.next_delay()

        backoff.reset()

        assert backoff.next_delay() == pytest.approx(0.1)
        assert backoff.next_delay() == pytest.approx(0.2)

    def test_failing_until_reset(self) -> None:
        backoff = Backoff(initial_s=0.1, max_s=1.0)
        assert backoff.failing is False

        backoff.next_delay()
        assert backoff.failing is True

        backoff.reset()
        assert backoff.failing is False

    def test_jitter_stays_within_its_fraction_of_each_step(self) -> None:
        backoff = Backoff(initial_s=0.1, max_s=1.0, jitter=0.2)
        bases = [0.1, 0.2, 0.4, 0.8] + [1.0] * 6

        for _ in range(50):
            backoff.reset()
            for base in bases:
                assert base * 0.8 <= backoff.next_delay() <= base * 1.2

    def test_a_long_outage_keeps_the_cap(self) -> None:
        backoff = Backoff(initial_s=0.001, max_s=5.0, jitter=0.0)

        delays = [backoff.next_delay() for _ in range(1_000)]

        assert delays[-1] == pytest.approx(5.0)
        assert max(delays) == pytest.approx(5.0)
