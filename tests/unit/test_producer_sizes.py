"""The producer refuses, before any I/O, an event the router would dead-letter for its size."""

from __future__ import annotations

import pytest

from eco_router.adapters.json_codec import OrjsonEventEncoder
from eco_router.domain.event import JobEvent
from eco_router.domain.event_size import EventSizeLimits
from eco_router.domain.parsing import parse_entry
from eco_router.domain.progress import StageEvent
from eco_router.producer import InvalidProgressEvent, producer_config


def routed_size(fields: dict[str, str], stream: str) -> int:
    """The size of the JSON the router makes of these fields."""
    event = parse_entry(
        domain="scan",
        stream=stream,
        entry_id="1700000000000-0",
        fields={k.encode(): v.encode() for k, v in fields.items()},
    )
    assert isinstance(event, JobEvent), event
    return len(OrjsonEventEncoder().encode(event))


def test_stage_events_of_the_default_plan_fit_the_default_limit() -> None:
    prepared = producer_config().stage_event(StageEvent("job-1", "vision", "started", progress=10))

    assert routed_size(prepared.fields, prepared.stream) < 300


def test_a_stage_event_above_the_event_limit_is_refused_with_the_setting_named() -> None:
    config = producer_config(max_event_bytes=256, max_result_bytes=4096)

    with pytest.raises(InvalidProgressEvent, match="EVENT_ROUTER_MAX_EVENT_BYTES") as raised:
        config.stage_event(StageEvent("j" * 128, "s" * 64, "started", progress=50, seq=31))

    assert "above 256 for a stage event" in str(raised.value)


def test_a_result_up_to_the_result_limit_is_accepted_and_one_above_refused() -> None:
    config = producer_config(max_event_bytes=1024, max_result_bytes=4096)
    fits = config.stage_event(StageEvent("job-1", "done", "done", result={"text": "가" * 1000}))

    with pytest.raises(InvalidProgressEvent, match="above 4096 for an event with a result"):
        config.stage_event(StageEvent("job-1", "done", "done", result={"text": "가" * 1400}))

    assert 3000 < routed_size(fits.fields, fits.stream) <= 4096


def test_json_escaping_counts_as_the_router_counts_it() -> None:
    # 300 control characters: 300 bytes in Python, 1800 in JSON.
    config = producer_config(max_event_bytes=1024, max_result_bytes=1500)

    with pytest.raises(InvalidProgressEvent, match="above 1500"):
        config.stage_event(StageEvent("job-1", "done", "done", result=["\u0001" * 300]))


def test_a_field_above_the_routers_field_limit_is_refused() -> None:
    config = producer_config(max_event_bytes=1 << 20, max_result_bytes=1 << 20)

    with pytest.raises(InvalidProgressEvent, match="router would refuse"):
        config.stage_event(StageEvent("job-1", "done", "done", result="x" * 70_000))


def test_whatever_the_producer_accepts_fits_the_routers_limit() -> None:
    limits = EventSizeLimits(max_event_bytes=512, max_result_bytes=1024)
    config = producer_config(max_event_bytes=512, max_result_bytes=1024)
    accepted = []
    for length in range(700, 1000, 7):
        try:
            accepted.append(
                config.stage_event(StageEvent("job-1", "done", "done", result="r" * length))
            )
        except InvalidProgressEvent:
            continue

    assert 10 < len(accepted) < 43  # some fit, some do not
    for prepared in accepted:
        size = routed_size(prepared.fields, prepared.stream)
        assert limits.check(size, stage="done", status="done", has_result=True) is None
