"""orjson adapter of `EventEncoder`."""

from __future__ import annotations

import orjson

from eco_router.application.ports import EventEncoder
from eco_router.domain.event import JobEvent


class OrjsonEventEncoder(EventEncoder):
    """Compact UTF-8 JSON, non-ASCII kept as is."""

    def encode(self, event: JobEvent) -> bytes:
        return orjson.dumps(event.as_payload())
