"""The fault suite's "nothing lost" check, judged in stream order, on hand-made histories."""

from __future__ import annotations

from tests.faults.harness import Entry, check_order, owed_in_stream_order

STREAM = "scan:events:0"


def entry(entry_id: str, seq: int | None, job: str | None = "J") -> Entry:
    return Entry(STREAM, entry_id, job, seq)


class TestOwedInStreamOrder:
    def test_every_rising_seq_is_owed_in_stream_order(self) -> None:
        entries = [entry("3-0", 3), entry("1-0", 1), entry("2-0", 2)]

        owed = owed_in_stream_order(entries)

        assert [e.seq for e in owed["J"]] == [1, 2, 3]

    def test_an_entry_appended_after_a_higher_seq_is_rightly_stale(self) -> None:
        entries = [entry("1-0", 1), entry("2-0", 5), entry("3-0", 4), entry("4-0", 5)]

        owed = owed_in_stream_order(entries)

        assert [e.entry_id for e in owed["J"]] == ["1-0", "2-0"]

    def test_ids_compare_as_numbers_not_text(self) -> None:
        entries = [entry("9-0", 1), entry("10-0", 2), entry("10-10", 4), entry("10-9", 3)]

        owed = owed_in_stream_order(entries)

        assert [e.seq for e in owed["J"]] == [1, 2, 3, 4]

    def test_invalid_entries_are_owed_nothing_and_judge_nothing(self) -> None:
        entries = [entry("1-0", None, job=None), entry("2-0", 1)]

        assert owed_in_stream_order(entries) == {"J": [entry("2-0", 1)]}

    def test_an_abandoned_entry_is_not_owed_but_still_makes_lower_seqs_stale(self) -> None:
        entries = [entry("1-0", 2), entry("2-0", 1), entry("3-0", 3)]

        owed = owed_in_stream_order(entries, abandoned=[(STREAM, "1-0")])

        assert [e.entry_id for e in owed["J"]] == ["3-0"]


class TestCheckOrder:
    def test_publishing_in_stream_order_loses_nothing(self) -> None:
        owed = {"J": [entry("1-0", 1), entry("2-0", 2)]}

        check = check_order(owed, [("J", "1-0"), ("J", "2-0")])

        assert (check.lost, check.in_order) == ([], 2)

    def test_an_entry_never_published_is_lost(self) -> None:
        owed = {"J": [entry("1-0", 1), entry("2-0", 2)]}

        check = check_order(owed, [("J", "2-0")])

        assert check.never == [entry("1-0", 1)]
        assert check.overtaken == []

    def test_an_entry_published_after_a_later_one_is_lost_to_clients(self) -> None:
        owed = {"J": [entry("1-0", 1), entry("2-0", 2), entry("3-0", 3)]}

        check = check_order(owed, [("J", "1-0"), ("J", "3-0"), ("J", "2-0")])

        assert check.overtaken == [entry("2-0", 2)]
        assert check.in_order == 2

    def test_a_republish_after_later_entries_does_not_count_against_the_first(self) -> None:
        owed = {"J": [entry("1-0", 1), entry("2-0", 2)]}

        check = check_order(owed, [("J", "1-0"), ("J", "2-0"), ("J", "1-0")])

        assert check.lost == []

    def test_a_publish_from_another_entry_with_the_same_seq_does_not_count(self) -> None:
        owed = {"J": [entry("1-0", 1)]}

        check = check_order(owed, [("J", "1-5")])

        assert check.never == [entry("1-0", 1)]

    def test_jobs_are_judged_apart(self) -> None:
        owed = {"J": [entry("1-0", 1)], "K": [entry("1-1", 1, job="K"), entry("2-0", 2, job="K")]}

        check = check_order(owed, [("K", "1-1"), ("J", "1-0"), ("K", "2-0")])

        assert (check.lost, check.in_order) == ([], 3)
