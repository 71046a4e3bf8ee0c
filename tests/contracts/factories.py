"""Test data and waiting helpers shared by the port contracts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from eco_router.adapters.json_codec import OrjsonEventEncoder
from eco_router.application.port_values import DeadLetter, Delivery, EncodedEvent
from eco_router.domain.event import JobEvent
from eco_router.domain.rejection import RejectReason
from eco_router.domain.streams import StreamFamily

SCAN = StreamFamily("scan:events", 2)
CHAT = StreamFamily("chat:events", 1)
FAMILIES = (SCAN, CHAT)
# The same families with the hash-tagged shard names of a Redis Cluster layout.
SCAN_TAGGED = StreamFamily("scan:events", 2, tagged=True)
CHAT_TAGGED = StreamFamily("chat:events", 1, tagged=True)
TAGGED_FAMILIES = (SCAN_TAGGED, CHAT_TAGGED)
GROUP = "router"

Fields = dict[bytes, bytes]

# Not UTF-8 and not JSON: exactly what must survive the trip byte for byte.
RAW_FIELDS: Fields = {
    b"job_id": b"job-1",
    b"seq": b"not-a-number",
    b"blob": b"\xff\x00\xfe\r\n\x80",
    b"stage": "caf\u00e9".encode(),
    b"note": b"  padded\t\n",
}

_ENCODER = OrjsonEventEncoder()


def entry_id(n: int) -> str:
    """A realistic stream entry id, distinct for every `n`."""
    return f"1700000000000-{n}"


def make_event(**overrides: Any) -> JobEvent:
    """A valid progress event of job `job-1` in the scan domain; override any field."""
    fields: dict[str, Any] = {
        "domain": "scan",
        "stream": "scan:events:0",
        "stream_id": entry_id(1),
        "job_id": "job-1",
        "seq": 1,
        "stage": "scanning",
        "status": "running",
    }
    fields.update(overrides)
    return JobEvent(**fields)


def encoded(**overrides: Any) -> EncodedEvent:
    """`make_event(**overrides)` with its real JSON payload."""
    event = make_event(**overrides)
    return EncodedEvent(event, _ENCODER.encode(event))


def make_letter(**overrides: Any) -> DeadLetter:
    """A dead letter for an entry of `scan:events:1` delivered 3 times; override any field."""
    delivery_fields: dict[str, Any] = {
        "family": SCAN,
        "stream": SCAN.streams[1],
        "entry_id": entry_id(7),
        "fields": RAW_FIELDS,
        "delivery_count": 3,
    }
    letter_fields: dict[str, Any] = {
        "reason": RejectReason.SEQ_NOT_INTEGER,
        "detail": "seq 'not-a-number' is not an integer",
    }
    for name, value in overrides.items():
        target = delivery_fields if name in delivery_fields else letter_fields
        target[name] = value
    return DeadLetter(Delivery(**delivery_fields), **letter_fields)


class ContractFamilies:
    """The stream families a contract runs over, taken from its class: a `scan` family of
    2 shards and a `chat` family of 1. A subclass sets `families = TAGGED_FAMILIES` to run
    every test on the hash-tagged shard names of a Redis Cluster layout."""

    families: ClassVar[tuple[StreamFamily, StreamFamily]] = FAMILIES

    @property
    def scan(self) -> StreamFamily:
        return self.families[0]

    @property
    def chat(self) -> StreamFamily:
        return self.families[1]

    @property
    def scan_0(self) -> str:
        return self.scan.streams[0]

    @property
    def scan_1(self) -> str:
        return self.scan.streams[1]

    @property
    def chat_0(self) -> str:
        return self.chat.streams[0]

    def event(self, **overrides: Any) -> JobEvent:
        """`make_event` on this class's shard `scan_0` unless overridden."""
        return make_event(**{"stream": self.scan_0, **overrides})

    def encoded(self, **overrides: Any) -> EncodedEvent:
        """`encoded` on this class's shard `scan_0` unless overridden."""
        return encoded(**{"stream": self.scan_0, **overrides})

    def letter(self, **overrides: Any) -> DeadLetter:
        """`make_letter` for an entry of this class's shard `scan_1` unless overridden."""
        return make_letter(**{"family": self.scan, "stream": self.scan_1, **overrides})


async def wait_until(
    condition: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0, what: str = "condition"
) -> None:
    """Poll `condition` until it holds; fail the test with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
