"""In-memory adapter of `DeadLetterSink`, writing the same entries as the Redis one."""

from __future__ import annotations

from collections.abc import Sequence

from eco_router.adapters.dead_letter_format import dead_letter_fields
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.port_values import DeadLetter
from eco_router.application.ports import DeadLetterSink


class InMemoryDeadLetterSink(DeadLetterSink):
    """Appends each letter to its family's `{prefix}:dlq` stream in `InMemoryStreams`, once
    per entry."""

    def __init__(self, streams: InMemoryStreams) -> None:
        self._streams = streams
        self._sent: set[tuple[str, str]] = set()

    async def send(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            entry = (letter.delivery.stream, letter.delivery.entry_id)
            if entry in self._sent:
                continue
            self._sent.add(entry)
            self._streams.xadd(
                letter.delivery.family.dead_letter_stream, dead_letter_fields(letter)
            )
