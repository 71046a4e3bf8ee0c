"""What the sentinels' announcements mean for one master's clients."""

from __future__ import annotations

import pytest

from eco_router.adapters.redis.connections.failover_watch import (
    ABORTED,
    PROMOTING,
    SWITCHED,
    Announcement,
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
