"""orjson adapters of `EventEncoder` and `EventDecoder`."""

from __future__ import annotations

import orjson

from eco_router.application.ports import EventDecoder, EventEncoder
from eco_router.domain.event import JobEvent
from eco_router.domain.sse import GatewayEvent


class OrjsonEventEncoder(EventEncoder):
    """Compact UTF-8 JSON, non-ASCII kept as is."""

    def encode(self, event: JobEvent) -> bytes:
        return orjson.dumps(event.as_payload())


class OrjsonEventDecoder(EventDecoder):
    """Reads the event id (or seq), kind and write time out of a routed payload."""

    def decode(self, payload: bytes) -> GatewayEvent | None:
        try:
            message = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(message, dict):
            return None
        # Events routed before event ids had their seq as their id.
        event_id = message.get("event_id", message.get("seq"))
        if not isinstance(event_id, int) or isinstance(event_id, bool):
            return None
        prev_id = message.get("prev_event_id")
        stream_id = message.get("stream_id")
        written_ms = None
        if isinstance(stream_id, str) and stream_id.partition("-")[0].isdigit():
            written_ms = int(stream_id.partition("-")[0])
        return GatewayEvent(
            event_id=event_id,
            stage=_text(message.get("stage")),
            status=_text(message.get("status")),
            data=payload,
            written_ms=written_ms,
            domain=_text(message.get("domain")),
            prev_id=prev_id if isinstance(prev_id, int) and not isinstance(prev_id, bool) else None,
            restart=message.get("restart") is True,
        )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
