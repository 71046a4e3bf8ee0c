"""Event names come from producers' stages: nothing in one may break the SSE framing."""

from __future__ import annotations

import pytest

from eco_router.domain.sse import GatewayEvent, event_frame


def event(stage: str | None, status: str | None = "started") -> GatewayEvent:
    return GatewayEvent(event_id=7, stage=stage, status=status, data=b'{"seq":7}')


@pytest.mark.parametrize(
    "stage", ["vision\nevent: done", "vision\r\ndata: x", "", None, "x" * 65, "a b"]
)
def test_an_unsafe_stage_is_sent_as_progress(stage: str | None) -> None:
    assert event(stage).name == "progress"
    assert event_frame(event(stage)) == b'id: 7\nevent: progress\ndata: {"seq":7}\n\n'


def test_a_plain_stage_names_the_event() -> None:
    assert event_frame(event("vision")).startswith(b"id: 7\nevent: vision\n")
