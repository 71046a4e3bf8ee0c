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
    """Reads seq, stage, status and the entry's write time out of a routed payload."""

    def decode(self, payload: bytes) -> GatewayEvent | None:
        try:
            message = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(message, dict):
            return None
        seq = message.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            return None
        stream_id = message.get("stream_id")
        written_ms = None
        if isinstance(stream_id, str) and stream_id.partition("-")[0].isdigit():
            written_ms = int(stream_id.partition("-")[0])
        return GatewayEvent(
            seq=seq,
            stage=_text(message.get("stage")),
            status=_text(message.get("status")),
            data=payload,
            written_ms=written_ms,
            domain=_text(message.get("domain")),
        )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
