"""In-memory adapter of `ShardProgress` over `InMemoryStreams`."""

from __future__ import annotations

from collections.abc import Sequence

from eco_router.adapters.memory.streams import InMemoryStreams, NoGroup
from eco_router.application.port_values import ShardCounters
from eco_router.application.ports import ShardProgress
from eco_router.domain.event import StreamEntryId
from eco_router.domain.streams import StreamFamily


class InMemoryShardProgress(ShardProgress):
    """Counts the entries each shard holds and those the group has read past; the model keeps
    no counter of its own, so deleted entries are not counted."""

    def __init__(
        self, streams: InMemoryStreams, *, families: Sequence[StreamFamily], group: str
    ) -> None:
        self._streams = streams
        self._shards = tuple(s for f in families for s in f.streams)
        self._group = group

    async def counters(self) -> list[ShardCounters]:
        counters = []
        for stream in self._shards:
            ids = [StreamEntryId.parse(i) for i, _ in self._streams.entries(stream)]
            try:
                last = StreamEntryId.parse(self._streams.last_delivered(stream, self._group))
            except NoGroup:
                # As on Redis, whose counters are the group's: no group, nothing known.
                counters.append(ShardCounters(stream, None, None))
                continue
            counters.append(ShardCounters(stream, len(ids), sum(1 for i in ids if i <= last)))
        return counters
