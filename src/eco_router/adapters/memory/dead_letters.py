"""In-memory adapter of `DeadLetterSink`, writing the same entries as the Redis one."""

from __future__ import annotations

from collections.abc import Sequence

from eco_router.adapters.dead_letter_format import dead_letter_fields
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.messages import DeadLetter
from eco_router.application.ports import DeadLetterSink


class InMemoryDeadLetterSink(DeadLetterSink):
    """Appends each letter to its family's `{prefix}:dlq` stream in `InMemoryStreams`."""

    def __init__(self, streams: InMemoryStreams) -> None:
        self._streams = streams

    async def send(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            self._streams.xadd(
                letter.delivery.family.dead_letter_stream, dead_letter_fields(letter)
            )
