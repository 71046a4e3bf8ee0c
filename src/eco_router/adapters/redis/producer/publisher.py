"""Producer side: idempotent, sharded appends of progress events and tokens, sync and
asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

import redis
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import NoScriptError

from eco_router.adapters.progress_entries import PreparedEntry, ProducerConfig
from eco_router.adapters.redis.connections.closed_writes import translate_closed_writes
from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.connections.replica_wait import ReplicasBehind, ReplicaWait
from eco_router.adapters.redis.control_store import RedisControlStore, SyncControlInbox
from eco_router.adapters.redis.errors import is_transient
from eco_router.adapters.redis.scripts import load_lua
from eco_router.adapters.system_clock import SystemClock
from eco_router.adapters.token_batches import (
    TokenSource,
    TokenTally,
    coalesced,
    coalesced_sync,
    refuse_text,
)
from eco_router.application.backoff import Backoff
from eco_router.application.control_inbox import ControlInbox
from eco_router.application.ports import ProgressPublisher
from eco_router.domain.control import ControlMessage
from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.domain.progress import InvalidProgressEvent
from eco_router.domain.token_entries import DEFAULT_COALESCE_MS, TokensPublished, token_run

logger = logging.getLogger(__name__)

# A batch of tokens holds the only copy of its deltas (a model's stream is read once): a write
# lost with its connection, or refused mid-failover, is sent again for up to this long before
# its error is raised. An entry of it that had landed is not added again: its marker answers.
TOKEN_WRITE_RETRY_S = 10.0


def script_arguments(
    entry: PreparedEntry, config: ProducerConfig
) -> tuple[list[str], list[str | int]]:
    """KEYS and ARGV of `append_once.lua`."""
    args: list[str | int] = [config.idempotency_ttl_s, config.maxlen]
    for name, value in entry.fields.items():
        args += (name, value)
    return [entry.stream, entry.idempotency_key], args


class AsyncStreamPublisher(ProgressPublisher):
    """Publishes progress events from asyncio code; returns the stream entry id."""

    def __init__(self, client: RedisClient, config: ProducerConfig) -> None:
        # Also on a client of the caller's: a connection closed under a call then fails as
        # redis-py's ConnectionError (after its retry), not as the event loop's raw error.
        translate_closed_writes()
        self.config = config
        self._client = client
        self._script = client.register_script(load_lua("append_once.lua"))
        self._wait = ReplicaWait(config.wait_replicas, config.wait_timeout_ms)
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

    async def publish_stage_event(
        self,
        job_id: str,
        stage: str,
        status: str,
        *,
        result: Any = None,
        progress: int | None = None,
        seq: int | None = None,
    ) -> str:
        entry = self.config.call(job_id, stage, status, result=result, progress=progress, seq=seq)
        return await self._append(entry)

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
        refuse_text(tokens)
        run = self.config.tokens(
            token_run(job_id, node=node, attempt=attempt, first_seq=first_seq),
            coalesce_ms=coalesce_ms,
        )
        tally = TokenTally(run.run.first_seq)
        async with contextlib.aclosing(coalesced(tokens, run.coalescing)) as batches:
            async for texts in batches:
                entries, refused = _prepared(run.entry, tally.entries, texts)
                await self._append_batch(entries)
                tally.add(texts[: len(entries)])
                if refused is not None:
                    raise refused
        return tally.published()

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
            self.config.token(job_id, content, seq=seq, node=node, attempt=attempt)
        )

    async def _append(self, entry: PreparedEntry) -> str:
        keys, args = script_arguments(entry, self.config)
        return _text(await self._wait.call(self._client, self._script, keys, args))

    async def _append_batch(self, entries: Sequence[PreparedEntry]) -> list[str]:
        """`_append_all`, sent again while it fails for a reason that passes."""
        retries = _Retries()
        while True:
            try:
                return await self._append_all(entries)
            except Exception as error:
                await asyncio.sleep(retries.delay_after(error))

    async def _append_all(self, entries: Sequence[PreparedEntry]) -> list[str]:
        """Each entry once, in order, in one round trip (with its WAIT, when asked)."""
        if len(entries) <= 1:
            return [await self._append(entry) for entry in entries]
        try:
            return await self._pipelined(entries)
        except NoScriptError:
            # A pipeline does not load scripts by itself. None of its calls ran; were some
            # to have, their markers make the second try return their first ids.
            await self._client.script_load(self._script.script)
            return await self._pipelined(entries)

    async def _pipelined(self, entries: Sequence[PreparedEntry]) -> list[str]:
        on_node: dict[str, Any] = {}
        if self._wait.replicas and isinstance(self._client, redis.asyncio.cluster.RedisCluster):
            await self._client.initialize()  # learns the slots on first use
            on_node["target_nodes"] = self._client.get_node_from_key(entries[0].stream)
        async with self._client.pipeline(transaction=False) as pipe:
            _queue_calls(pipe, self._script.sha, entries, self.config, self._wait, on_node)
            replies = await pipe.execute()
        return _entry_ids(replies, self._wait)


class StreamPublisher:
    """Publishes progress events from synchronous code (a Celery task, a thread)."""

    def __init__(
        self, client: redis.Redis | redis.cluster.RedisCluster, config: ProducerConfig
    ) -> None:
        self.config = config
        self._client = client
        self._script = client.register_script(load_lua("append_once.lua"))
        self._wait = ReplicaWait(config.wait_replicas, config.wait_timeout_ms)
        self._controls = SyncControlInbox(client, config.family)

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

    def publish_stage_event(
        self,
        job_id: str,
        stage: str,
        status: str,
        *,
        result: Any = None,
        progress: int | None = None,
        seq: int | None = None,
    ) -> str:
        entry = self.config.call(job_id, stage, status, result=result, progress=progress, seq=seq)
        return self._append(entry)

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
        refuse_text(tokens)
        run = self.config.tokens(
            token_run(job_id, node=node, attempt=attempt, first_seq=first_seq),
            coalesce_ms=coalesce_ms,
        )
        tally = TokenTally(run.run.first_seq)
        for texts in coalesced_sync(tokens, run.coalescing):
            entries, refused = _prepared(run.entry, tally.entries, texts)
            self._append_batch(entries)
            tally.add(texts[: len(entries)])
            if refused is not None:
                raise refused
        return tally.published()

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
        return self._append(self.config.token(job_id, content, seq=seq, node=node, attempt=attempt))

    def _append(self, entry: PreparedEntry) -> str:
        keys, args = script_arguments(entry, self.config)
        return _text(self._wait.call_sync(self._client, self._script, keys, args))

    def _append_batch(self, entries: Sequence[PreparedEntry]) -> list[str]:
        retries = _Retries()
        while True:
            try:
                return self._append_all(entries)
            except Exception as error:
                time.sleep(retries.delay_after(error))

    def _append_all(self, entries: Sequence[PreparedEntry]) -> list[str]:
        if len(entries) <= 1:
            return [self._append(entry) for entry in entries]
        try:
            return self._pipelined(entries)
        except NoScriptError:
            self._client.script_load(self._script.script)
            return self._pipelined(entries)

    def _pipelined(self, entries: Sequence[PreparedEntry]) -> list[str]:
        on_node: dict[str, Any] = {}
        if self._wait.replicas and isinstance(self._client, redis.cluster.RedisCluster):
            on_node["target_nodes"] = self._client.get_node_from_key(entries[0].stream)  # type: ignore[no-untyped-call]
        with self._client.pipeline(transaction=False) as pipe:
            _queue_calls(pipe, self._script.sha, entries, self.config, self._wait, on_node)
            replies = pipe.execute()
        return _entry_ids(replies, self._wait)


class _Retries:
    """How long to wait before sending a failed batch of tokens again; raises the error when
    it will not pass by retrying, or when `TOKEN_WRITE_RETRY_S` would be over."""

    def __init__(self) -> None:
        self._backoff = Backoff(initial_s=0.05, max_s=1.0)
        self._deadline = time.monotonic() + TOKEN_WRITE_RETRY_S

    def delay_after(self, error: Exception) -> float:
        delay = self._backoff.next_delay()
        if not is_transient(error) or time.monotonic() + delay > self._deadline:
            raise error
        logger.info("token write failed, sending it again in %.2f s: %r", delay, error)
        return delay


def _prepared(
    entry: Callable[[int, str], PreparedEntry], start: int, texts: Sequence[str]
) -> tuple[list[PreparedEntry], InvalidProgressEvent | None]:
    """The batch's entries, numbered from `start`, up to the first the router would refuse
    (too large): those before it are still written, then its error is raised."""
    prepared: list[PreparedEntry] = []
    for offset, text in enumerate(texts):
        try:
            prepared.append(entry(start + offset, text))
        except InvalidProgressEvent as error:
            return prepared, error
    return prepared, None


def _queue_calls(
    pipe: Any,
    sha: str,
    entries: Sequence[PreparedEntry],
    config: ProducerConfig,
    wait: ReplicaWait,
    on_node: dict[str, Any],
) -> None:
    for entry in entries:
        keys, args = script_arguments(entry, config)
        pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
    if wait.replicas:
        # On the connection that wrote: WAIT counts the replicas that have its writes.
        pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms, **on_node)


def _entry_ids(replies: list[Any], wait: ReplicaWait) -> list[str]:
    if wait.replicas:
        acked = int(replies.pop())
        if acked < wait.replicas:
            raise ReplicasBehind(
                f"{acked} of {wait.replicas} replicas acknowledged the write within "
                f"{wait.timeout_ms} ms"
            )
    return [_text(reply) for reply in replies]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
