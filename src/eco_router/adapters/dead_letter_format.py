"""The dead-letter entry format, shared by every dead-letter adapter and its readers."""

from __future__ import annotations

import time
from collections.abc import Mapping

from eco_router.application.port_values import DeadLetter, StoredDeadLetter

# Readers import the stored form from here, beside the format that produces it.
__all__ = ["FIELD_PREFIX", "StoredDeadLetter", "dead_letter_fields", "read_dead_letter"]

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


def read_dead_letter(dlq_id: str, fields: Mapping[bytes, bytes]) -> StoredDeadLetter:
    """Parse an entry written by `dead_letter_fields`."""

    def text(name: bytes) -> str:
        return fields.get(name, b"").decode(errors="replace")

    return StoredDeadLetter(
        dlq_id=dlq_id,
        stream=text(b"stream"),
        entry_id=text(b"id"),
        reason=text(b"reason"),
        detail=text(b"detail"),
        deliveries=int(text(b"deliveries") or 0),
        dead_at_ms=int(text(b"dead_at_ms") or 0),
        fields={k[len(FIELD_PREFIX) :]: v for k, v in fields.items() if k.startswith(FIELD_PREFIX)},
    )
