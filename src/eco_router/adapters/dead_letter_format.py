"""The dead-letter entry format, shared by every dead-letter adapter and its readers."""

from __future__ import annotations

import time

from eco_router.application.messages import DeadLetter

FIELD_PREFIX = b"field:"


def dead_letter_fields(letter: DeadLetter) -> dict[bytes, bytes]:
    """The dead-letter entry: where it came from, why, and the original fields byte for byte."""
    delivery = letter.delivery
    fields = {
        b"stream": delivery.stream.encode(),
        b"id": delivery.entry_id.encode(),
        b"reason": letter.reason.value.encode(),
        b"detail": letter.detail.encode(),
        b"deliveries": str(delivery.delivery_count).encode(),
        b"dead_at_ms": str(int(time.time() * 1000)).encode(),
    }
    for name, value in (delivery.fields or {}).items():
        fields[FIELD_PREFIX + name] = value
    return fields
