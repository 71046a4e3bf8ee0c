"""What the sentinels' announcements mean for one master's clients."""

from __future__ import annotations

import pytest

from eco_router.adapters.redis.connections.failover_watch import (
    ABORTED,
    HOLD_S,
    PROMOTING,
    SWITCHED,
    Announcement,
    FailoverState,
    announced,
)

MASTER = "mymaster"
OLD, NEW = ("10.0.0.1", 6379), ("10.0.0.2", 6379)


class TestAnnounced:
    @pytest.mark.parametrize(
        ("channel", "data", "expected"),
        [
            pytest.param(
                PROMOTING,
                "slave 10.0.0.2:6379 10.0.0.2 6379 @ mymaster 10.0.0.1 6379",
                Announcement(hold=True),
                id="the promotion of a replica of this master holds its clients",
            ),
            pytest.param(
                PROMOTING,
                "slave 10.0.0.2:6379 10.0.0.2 6379 @ other 10.0.0.1 6379",
                None,
                id="another master's promotion means nothing here",
            ),
            pytest.param(
                SWITCHED,
                "mymaster 10.0.0.1 6379 10.0.0.2 6379",
                Announcement(hold=False, moved=(OLD, NEW)),
                id="the switch ends the hold and names both masters",
            ),
            pytest.param(
                SWITCHED, "other 10.0.0.1 6379 10.0.0.2 6379", None, id="another master's switch"
            ),
            pytest.param(SWITCHED, "mymaster 10.0.0.1", None, id="a switch cut short"),
            *(
                pytest.param(
                    channel,
                    "master mymaster 10.0.0.1 6379",
                    Announcement(hold=False),
                    id=f"{channel} ends the hold",
                )
                for channel in ABORTED
            ),
            pytest.param("+sdown", "master mymaster 10.0.0.1 6379", None, id="other events"),
        ],
    )
    def test_an_announcement_means_hold_resume_or_nothing(
        self, channel: str, data: str, expected: Announcement | None
    ) -> None:
        assert announced(MASTER, channel, data) == expected


PROMOTION = "slave 10.0.0.2:6379 10.0.0.2 6379 @ mymaster 10.0.0.1 6379"
SWITCH = "mymaster 10.0.0.1 6379 10.0.0.2 6379"


class TestFailoverState:
    """What both watches (blocking and asyncio) act on."""

    def test_a_promotion_holds_and_its_end_releases_naming_the_promoted_master(self) -> None:
        state = FailoverState(MASTER)

        assert state.heard(PROMOTING, PROMOTION, now=0) is True
        assert state.held
        assert state.heard(SWITCHED, SWITCH, now=1) is True
        assert (state.held, state.moved) == (False, (OLD, NEW))

    def test_the_same_end_from_another_sentinel_is_not_acted_on_again(self) -> None:
        state = FailoverState(MASTER)
        state.heard(SWITCHED, SWITCH, now=0)

        assert state.heard(SWITCHED, SWITCH, now=0.1) is False

    def test_another_masters_announcements_change_nothing(self) -> None:
        state = FailoverState("other")

        assert state.heard(PROMOTING, PROMOTION, now=0) is False
        assert not state.held

    def test_the_old_master_is_overruled_only_until_every_sentinel_knows(self) -> None:
        state = FailoverState(MASTER)
        state.heard(SWITCHED, SWITCH, now=100)

        assert state.promoted_in_place_of(OLD, now=100 + HOLD_S) == NEW
        assert state.promoted_in_place_of(OLD, now=100 + HOLD_S + 0.1) == OLD
        assert state.promoted_in_place_of(NEW, now=100) == NEW
