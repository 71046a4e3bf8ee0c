"""Stream-entry decoding under arbitrary field maps: never a crash, a reason for every refusal."""

from __future__ import annotations

import json

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eco_router.adapters.json_codec import OrjsonEventEncoder
from eco_router.domain.event import JobEvent
from eco_router.domain.parsing import parse_entry
from eco_router.domain.rejection import Rejection, RejectReason

STREAM = "scan:events:1"
ENTRY_ID = "1700000000000-0"
FIELD_LIMIT = 512

# Names the parser looks at, so that generated maps exercise its branches, not only extras.
KNOWN_NAMES = st.sampled_from(
    [b"job_id", b"seq", b"stage", b"status", b"ts", b"progress", b"result", b"note"]
)
JSON_ISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
VALUES = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    st.integers().map(lambda n: str(n).encode()),
    st.sampled_from([b"", b"job-1", b"7", b"NaN", b"1e309", b"-Infinity", b"x" * 600]),
    # Python's json writes NaN and Infinity as bare words; they must come out refused.
    JSON_ISH.map(lambda v: json.dumps(v).encode()),
)
FIELD_MAPS = st.dictionaries(KNOWN_NAMES | st.binary(max_size=12), VALUES, max_size=9)


def parse(fields: dict[bytes, bytes]) -> JobEvent | Rejection:
    return parse_entry(
        domain="scan",
        stream=STREAM,
        entry_id=ENTRY_ID,
        fields=fields,
        max_field_bytes=FIELD_LIMIT,
    )


def fields_of(event: JobEvent) -> dict[bytes, bytes]:
    """The entry a producer would write for `event`."""
    fields = {name: value for name, value in event.extra.items()}
    fields["job_id"] = event.job_id
    fields["seq"] = str(event.seq)
    for name in ("stage", "status", "ts"):
        value = getattr(event, name)
        if value is not None:
            fields[name] = value
    if event.progress is not None:
        fields["progress"] = str(event.progress)
    if event.has_result:
        fields["result"] = json.dumps(event.result, allow_nan=False)
    return {name.encode(): value.encode() for name, value in fields.items()}


# No deadline: the unit tier runs on every core of a small machine at once.
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FIELD_MAPS)
@example({b"job_id": b"j", b"seq": b"1", b"result": b"NaN"})
@example({b"job_id": b"j", b"seq": b"1", b"result": b'{"a": 1e309}'})
@example({b"job_id": b"j", b"seq": b"1", b"result": b"", b"progress": b""})
@example({b"job_id": b"j", b"seq": b"1", b"result": b"[" * 3000})
def test_any_field_map_is_an_event_that_round_trips_or_a_rejection_with_a_reason(
    fields: dict[bytes, bytes],
) -> None:
    outcome = parse(fields)

    if isinstance(outcome, Rejection):
        assert outcome.reason in set(RejectReason)
        assert outcome.detail
        return
    assert parse(fields_of(outcome)) == outcome
    try:
        payload = OrjsonEventEncoder().encode(outcome)
    except TypeError:
        # An integer beyond 64 bits: the router dead-letters it as result_not_json.
        return
    assert orjson.loads(payload) == outcome.as_payload()
