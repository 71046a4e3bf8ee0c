"""In-memory adapter of `DeadLetterArchive`, reading what `InMemoryDeadLetterSink` wrote."""

from __future__ import annotations

from collections.abc import Sequence

from eco_router.adapters.dead_letter_format import read_dead_letter
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.port_values import DeadLetterTally, Replayed, StoredDeadLetter
from eco_router.application.ports import DeadLetterArchive
from eco_router.domain.streams import StreamFamily


class InMemoryDeadLetterArchive(DeadLetterArchive):
    """Dead letters of `InMemoryStreams`, with the Redis archive's replay semantics."""

    def __init__(self, streams: InMemoryStreams) -> None:
        self._streams = streams

    async def oldest(self, family: StreamFamily, *, count: int = 100) -> list[StoredDeadLetter]:
        return self._letters(family)[:count]

    async def replay(self, family: StreamFamily, dlq_ids: Sequence[str] | None) -> list[Replayed]:
        letters = self._letters(family)
        if dlq_ids is not None:
            by_id = {letter.dlq_id: letter for letter in letters}
            for dlq_id in dlq_ids:
                if dlq_id not in by_id:
                    raise LookupError(f"no dead letter {dlq_id} in {family.dead_letter_stream}")
            letters = [by_id[dlq_id] for dlq_id in dlq_ids]
        replayed = []
        for letter in letters:
            if letter.stream not in family.streams:
                raise ValueError(
                    f"dead letter {letter.dlq_id} names stream {letter.stream!r}, "
                    f"which is not a shard of {family.prefix}"
                )
            new_id = self._streams.xadd(letter.stream, letter.fields)
            self._streams.delete_entry(family.dead_letter_stream, letter.dlq_id)
            replayed.append(Replayed(letter.dlq_id, letter.stream, new_id))
        return replayed

    async def tally(self, family: StreamFamily) -> DeadLetterTally:
        entries = self._streams.entries(family.dead_letter_stream)
        return DeadLetterTally(len(entries), entries[-1][0] if entries else None)

    def _letters(self, family: StreamFamily) -> list[StoredDeadLetter]:
        return [
            read_dead_letter(dlq_id, fields)
            for dlq_id, fields in self._streams.entries(family.dead_letter_stream)
        ]
