"""What a connection remembers of the ids it sent: enough to tell a repeat from an event it
never got, bounded however long the stream."""

from __future__ import annotations

from eco_router.application.stream_job_events import RecentIds


class TestRecentIds:
    def test_a_sent_id_is_known_and_one_skipped_is_never_sent(self) -> None:
        recent = RecentIds(10)
        for event_id in (11, 13, 20):
            recent.add(event_id)

        assert recent.never_sent(13) is False
        assert recent.never_sent(12) is True
        assert recent.never_sent(5) is True  # before the first sent: never sent here

    def test_a_long_stream_keeps_a_bounded_number_of_ids(self) -> None:
        recent = RecentIds(1, keep=64)
        for event_id in range(2, 10_001):
            recent.add(event_id)

        assert 64 <= len(recent) < 128
        assert recent.never_sent(10_000) is False

    def test_an_id_older_than_those_kept_is_unknown(self) -> None:
        recent = RecentIds(1, keep=4)
        for event_id in range(2, 20):
            recent.add(event_id)

        assert recent.never_sent(2) is None
        assert recent.never_sent(19) is False
