"""Producer side on Redis: the two shells, blocking and asyncio, around `PublisherCore`; each
only sends what the core decides and waits for the replies."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Sequence
from typing import Any

import redis
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import NoScriptError

from eco_router.adapters.producer_calls import StageEventCalls
from eco_router.adapters.producer_core import (
    TOKEN_WRITE_RETRY_S,
    PublisherCore,
    TokenRetries,
    entry_id,
    script_arguments,
)
from eco_router.adapters.progress_entries import PreparedEntry, ProducerConfig
from eco_router.adapters.redis.connections.closed_writes import translate_closed_writes
from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.connections.replica_wait import ReplicaWait
from eco_router.adapters.redis.control_store import BlockingControlInbox, RedisControlStore
from eco_router.adapters.redis.errors import is_transient
from eco_router.adapters.redis.scripts import load_lua
from eco_router.adapters.system_clock import SystemClock
from eco_router.adapters.token_batches import TokenSource, coalesced, coalesced_sync
from eco_router.application.control_inbox import ControlInbox
from eco_router.application.ports import ProgressPublisher
from eco_router.domain.control import ControlMessage
from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.domain.progress import StageEvent
from eco_router.domain.token_entries import DEFAULT_COALESCE_MS, TokensPublished

__all__ = ["TOKEN_WRITE_RETRY_S", "AsyncStreamPublisher", "StreamPublisher", "script_arguments"]


class AsyncStreamPublisher(StageEventCalls[Awaitable[str]], ProgressPublisher):
    """Publishes progress events from asyncio code; returns the stream entry id."""

    def __init__(self, client: RedisClient, config: ProducerConfig) -> None:
        # Also on a client of the caller's: a connection closed under a call then fails as
        # redis-py's ConnectionError (after its retry), not as the event loop's raw error.
        translate_closed_writes()
        self.config = config
        self._core = PublisherCore(config)
        self._wait = ReplicaWait(config.wait_replicas, config.wait_timeout_ms)
        self._client = client
        self._script = client.register_script(load_lua("append_once.lua"))
        store = RedisControlStore(client, families=[config.family], clock=SystemClock())
        self._controls = ControlInbox(store, config.family.domain)

    async def cancelled(self, job_id: str) -> bool:
        """Whether a viewer asked to cancel the job: one read while none did, none once one
        did; cheap enough between tokens (docs/BENCHMARKS.md)."""
        return await self._controls.cancelled(job_id)

    def control_messages(
        self, job_id: str, *, timeout_s: float | None = None
    ) -> AsyncIterator[ControlMessage]:
        """Each unacknowledged control message of the job once, in order, waiting for more;
        ends when the job has ended or after `timeout_s`. Acknowledge each once handled: an
        unacknowledged one is handed again to the next reader (a restarted worker)."""
        return self._controls.messages(job_id, timeout_s=timeout_s)

    async def next_control(self, job_id: str, *, timeout_s: float) -> ControlMessage | None:
        """The job's first unacknowledged control message, waiting up to `timeout_s`."""
        return await self._controls.next(job_id, timeout_s=timeout_s)

    async def acknowledge(self, message: ControlMessage) -> bool:
        """A control message handled: never handed again."""
        return await self._controls.acknowledge(message)

    async def publish(self, event: StageEvent) -> str:
        return await self._append(self._core.stage_event(event))

    async def publish_tokens(
        self,
        job_id: str,
        tokens: TokenSource,
        *,
        node: str | None = None,
        attempt: int = 0,
        coalesce_ms: float = DEFAULT_COALESCE_MS,
        first_seq: int = FIRST_TOKEN_SEQ,
    ) -> TokensPublished:
        """Write a job's answer text as it arrives: `tokens` yields `str` deltas or
        OpenAI-style chunks (an async iterable, or a list of them).

        Deltas arriving within `coalesce_ms` of an entry's first one share it (0: one entry
        per delta); entries ready together go in one round trip. The n-th entry (from 0) is
        seq `first_seq + n`; each is written once per (job, attempt, seq), so a retried round
        trip adds nothing. A retried task passes a higher `attempt`: the router starts the
        job's text again and drops the older attempt's late tokens. Settings are validated
        before the first delta is read (`InvalidProgressEvent`). A write that fails on a lost
        connection is sent again for up to `TOKEN_WRITE_RETRY_S`; what the source yielded
        before it failed is written, then its error is raised.
        """
        writing = self._core.token_writing(
            job_id, tokens, node=node, attempt=attempt, coalesce_ms=coalesce_ms, first_seq=first_seq
        )
        async with contextlib.aclosing(coalesced(tokens, writing.coalescing)) as batches:
            async for texts in batches:
                batch = writing.batch(texts)
                await self._append_batch(batch.entries)
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
        """Write one token a worker numbered itself; returns its stream entry id (the first
        one's, when this (job, attempt, seq) was written already)."""
        return await self._append(
            self._core.token(job_id, content, seq=seq, node=node, attempt=attempt)
        )

    async def _append(self, entry: PreparedEntry) -> str:
        keys, args = self._core.script_call(entry)
        return entry_id(await self._wait.call(self._client, self._script, keys, args))

    async def _append_batch(self, entries: Sequence[PreparedEntry]) -> list[str]:
        """Each entry once, in order, in one round trip (with its WAIT, when asked); sent
        again as `TokenRetries` decides."""
        retries = TokenRetries(time.monotonic())
        while True:
            try:
                if retries.script_to_load():
                    await self._client.script_load(self._script.script)
                if len(entries) <= 1:
                    return [await self._append(entry) for entry in entries]
                return await self._pipelined(entries)
            except Exception as error:
                await asyncio.sleep(_delay_after(retries, error))

    async def _pipelined(self, entries: Sequence[PreparedEntry]) -> list[str]:
        on_node: dict[str, Any] = {}
        client = self._client
        if self._core.replicas and isinstance(client, redis.asyncio.cluster.RedisCluster):
            await client.initialize()  # learns the slots on first use
            on_node["target_nodes"] = client.get_node_from_key(entries[0].stream)
        async with client.pipeline(transaction=False) as pipe:
            for words, options in self._core.pipelined(self._script.sha, entries, on_node):
                pipe.execute_command(*words, **options)
            replies = await pipe.execute()
        return self._core.entry_ids(replies)


class StreamPublisher(StageEventCalls[str]):
    """Publishes progress events from synchronous code (a Celery task, a thread)."""

    def __init__(
        self, client: redis.Redis | redis.cluster.RedisCluster, config: ProducerConfig
    ) -> None:
        self.config = config
        self._core = PublisherCore(config)
        self._wait = ReplicaWait(config.wait_replicas, config.wait_timeout_ms)
        self._client = client
        self._script = client.register_script(load_lua("append_once.lua"))
        self._controls = BlockingControlInbox(client, config.family)

    def cancelled(self, job_id: str) -> bool:
        """As `AsyncStreamPublisher.cancelled`."""
        return self._controls.cancelled(job_id)

    def control_messages(
        self, job_id: str, *, timeout_s: float | None = None
    ) -> Iterator[ControlMessage]:
        """As `AsyncStreamPublisher.control_messages`."""
        return self._controls.messages(job_id, timeout_s=timeout_s)

    def next_control(self, job_id: str, *, timeout_s: float) -> ControlMessage | None:
        """As `AsyncStreamPublisher.next_control`."""
        return self._controls.next(job_id, timeout_s=timeout_s)

    def acknowledge(self, message: ControlMessage) -> bool:
        """As `AsyncStreamPublisher.acknowledge`."""
        return self._controls.acknowledge(message)

    def publish(self, event: StageEvent) -> str:
        return self._append(self._core.stage_event(event))

    def publish_tokens(
        self,
        job_id: str,
        tokens: Iterable[Any],
        *,
        node: str | None = None,
        attempt: int = 0,
        coalesce_ms: float = DEFAULT_COALESCE_MS,
        first_seq: int = FIRST_TOKEN_SEQ,
    ) -> TokensPublished:
        """`AsyncStreamPublisher.publish_tokens` for a synchronous iterable, read in this
        thread: a list goes in as few round trips as its entries fill; from any other
        iterator, which may block between deltas, each entry is written once it is closed (a
        delta came after its window) or at the end."""
        writing = self._core.token_writing(
            job_id, tokens, node=node, attempt=attempt, coalesce_ms=coalesce_ms, first_seq=first_seq
        )
        for texts in coalesced_sync(tokens, writing.coalescing):
            batch = writing.batch(texts)
            self._append_batch(batch.entries)
            writing.written(batch)
        return writing.published()

    def publish_token(
        self,
        job_id: str,
        content: str,
        *,
        seq: int,
        node: str | None = None,
        attempt: int = 0,
    ) -> str:
        """`AsyncStreamPublisher.publish_token` from synchronous code."""
        return self._append(self._core.token(job_id, content, seq=seq, node=node, attempt=attempt))

    def _append(self, entry: PreparedEntry) -> str:
        keys, args = self._core.script_call(entry)
        return entry_id(self._wait.call_sync(self._client, self._script, keys, args))

    def _append_batch(self, entries: Sequence[PreparedEntry]) -> list[str]:
        """As `AsyncStreamPublisher._append_batch`."""
        retries = TokenRetries(time.monotonic())
        while True:
            try:
                if retries.script_to_load():
                    self._client.script_load(self._script.script)
                if len(entries) <= 1:
                    return [self._append(entry) for entry in entries]
                return self._pipelined(entries)
            except Exception as error:
                time.sleep(_delay_after(retries, error))

    def _pipelined(self, entries: Sequence[PreparedEntry]) -> list[str]:
        on_node: dict[str, Any] = {}
        if self._core.replicas and isinstance(self._client, redis.cluster.RedisCluster):
            on_node["target_nodes"] = self._client.get_node_from_key(entries[0].stream)  # type: ignore[no-untyped-call]
        with self._client.pipeline(transaction=False) as pipe:
            for words, options in self._core.pipelined(self._script.sha, entries, on_node):
                pipe.execute_command(*words, **options)
            replies = pipe.execute()
        return self._core.entry_ids(replies)


def _delay_after(retries: TokenRetries, error: Exception) -> float:
    """`retries.delay_after` told what redis-py's `error` is."""
    return retries.delay_after(
        error,
        transient=is_transient(error),
        now=time.monotonic(),
        no_script=isinstance(error, NoScriptError),
    )
