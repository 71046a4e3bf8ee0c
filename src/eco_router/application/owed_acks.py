"""Acks of settled entries, sent with the consumer's next round trip to the streams server."""

from __future__ import annotations

from collections.abc import Sequence

from eco_router.application.errors import PermanentError
from eco_router.application.held_shards import HeldShards, streams_of
from eco_router.application.port_values import Delivery
from eco_router.application.ports import EventSource


class OwedAcks:
    """The settled entries not acked yet; each stays in hand (`HeldShards`) until its ack has
    landed, so a shard is not given up before."""

    def __init__(self, *, source: EventSource, held: HeldShards) -> None:
        self._source = source
        self._held = held
        self._owed: list[Delivery] = []

    def __len__(self) -> int:
        return len(self._owed)

    def owe(self, deliveries: Sequence[Delivery]) -> None:
        self._owed += deliveries

    def take(self) -> list[Delivery]:
        """The owed acks, for a round trip that carries them (`landed` or `owe_again` after)."""
        acks, self._owed = self._owed, []
        return acks

    def owe_again(self, acks: Sequence[Delivery]) -> None:
        """`acks` may not have landed: they go with a later round trip (acking twice is
        harmless)."""
        self._owed[:0] = acks

    def landed(self, acks: Sequence[Delivery]) -> None:
        self._held.put_down(streams_of(acks))

    def forget(self) -> None:
        self._owed.clear()

    async def flush(self) -> None:
        """The owed acks, in a round trip of their own."""
        acks = self.take()
        if not acks:
            return
        try:
            await self._source.ack(acks)
        except PermanentError:
            # Acked, but on the shard it names, which is quarantined by the caller.
            self.landed(acks)
            raise
        except BaseException:
            self.owe_again(acks)
            raise
        self.landed(acks)
