"""In-memory producer: the Redis publishers' core (`PublisherCore`), appending to
`InMemoryStreams`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, Awaitable, Iterable
from typing import Any

from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.adapters.producer_calls import StageEventCalls
from eco_router.adapters.producer_core import PublisherCore
from eco_router.adapters.progress_entries import PreparedEntry, ProducerConfig
from eco_router.adapters.token_batches import coalesced
from eco_router.application.ports import ProgressPublisher
from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.domain.progress import StageEvent
from eco_router.domain.token_entries import DEFAULT_COALESCE_MS, TokensPublished


class InMemoryStreamPublisher(StageEventCalls[Awaitable[str]], ProgressPublisher):
    """Appends each (job, stage, status) and each (job, attempt, token seq) once; a repeat
    returns the first entry's id. `round_trips` counts the writes a Redis publisher would
    send: one per batch of tokens ready together."""

    def __init__(self, streams: InMemoryStreams, config: ProducerConfig) -> None:
        self.config = config
        self.round_trips = 0
        self._core = PublisherCore(config)
        self._streams = streams
        self._first_ids: dict[str, str] = {}

    async def publish(self, event: StageEvent) -> str:
        entry = self._core.stage_event(event)
        self.round_trips += 1
        return self._append(entry)

    async def publish_tokens(
        self,
        job_id: str,
        tokens: AsyncIterable[Any] | Iterable[Any],
        *,
        node: str | None = None,
        attempt: int = 0,
        coalesce_ms: float = DEFAULT_COALESCE_MS,
        first_seq: int = FIRST_TOKEN_SEQ,
    ) -> TokensPublished:
        writing = self._core.token_writing(
            job_id, tokens, node=node, attempt=attempt, coalesce_ms=coalesce_ms, first_seq=first_seq
        )
        async with contextlib.aclosing(coalesced(tokens, writing.coalescing)) as batches:
            async for texts in batches:
                batch = writing.batch(texts)
                self.round_trips += 1
                for entry in batch.entries:
                    self._append(entry)
                writing.written(batch)
        return writing.published()

    async def publish_token(
        self,
        job_id: str,
        content: str,
        *,
        seq: int,
        node: str | None = None,
        attempt: int = 0,
    ) -> str:
        entry = self._core.token(job_id, content, seq=seq, node=node, attempt=attempt)
        self.round_trips += 1
        return self._append(entry)

    def _append(self, entry: PreparedEntry) -> str:
        first = self._first_ids.get(entry.idempotency_key)
        if first is None:
            first = self._first_ids[entry.idempotency_key] = self._streams.xadd(
                entry.stream, entry.fields
            )
        return first
