"""The producer's rules without I/O, for every publisher (blocking, asyncio, in memory): what
each call appends, the commands that append it, what their replies mean, how a run of tokens
is numbered, counted and retried. A publisher only sends and waits."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eco_router.adapters.progress_entries import PreparedEntry, PreparedTokens, ProducerConfig
from eco_router.adapters.redis.connections.replica_wait import ReplicasBehind, ReplicaWait
from eco_router.adapters.token_batches import TokenTally, refuse_text
from eco_router.application.backoff import Backoff
from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.domain.progress import InvalidProgressEvent, StageEvent
from eco_router.domain.token_entries import (
    DEFAULT_COALESCE_MS,
    Coalescing,
    TokensPublished,
    token_run,
)

logger = logging.getLogger(__name__)

# A batch of tokens holds the only copy of its deltas (a model's stream is read once): a write
# lost with its connection, or refused mid-failover, is sent again for up to this long before
# its error is raised. An entry of it that had landed is not added again: its marker answers.
TOKEN_WRITE_RETRY_S = 10.0

# One command of a pipeline: its words, and where a cluster client sends it.
Command = tuple[tuple[str | int, ...], dict[str, Any]]


def script_arguments(
    entry: PreparedEntry, config: ProducerConfig
) -> tuple[list[str], list[str | int]]:
    """KEYS and ARGV of `append_once.lua`."""
    args: list[str | int] = [config.idempotency_ttl_s, config.maxlen]
    for name, value in entry.fields.items():
        args += (name, value)
    return [entry.stream, entry.idempotency_key], args


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Entries ready together, written in one round trip: up to the first the router would
    refuse (too large), whose error is raised once those before it are written."""

    entries: list[PreparedEntry]
    texts: Sequence[str]
    refused: InvalidProgressEvent | None


class TokenWriting:
    """One `publish_tokens` call: its entries numbered in order, and what was written."""

    def __init__(self, prepared: PreparedTokens) -> None:
        self._prepared = prepared
        self._tally = TokenTally(prepared.run.first_seq)

    @property
    def coalescing(self) -> Coalescing:
        return self._prepared.coalescing

    def batch(self, texts: Sequence[str]) -> TokenBatch:
        """The entries of `texts`, the next ones of the run."""
        entries: list[PreparedEntry] = []
        for offset, text in enumerate(texts):
            try:
                entries.append(self._prepared.entry(self._tally.entries + offset, text))
            except InvalidProgressEvent as error:
                return TokenBatch(entries, texts[: len(entries)], error)
        return TokenBatch(entries, texts, None)

    def written(self, batch: TokenBatch) -> None:
        """`batch` is in the stream; raises its refusal, if any."""
        self._tally.add(batch.texts)
        if batch.refused is not None:
            raise batch.refused

    def published(self) -> TokensPublished:
        return self._tally.published()


class TokenRetries:
    """How long to wait before sending a failed batch of tokens again; raises the error when
    it will not pass by retrying (`transient` says which do), or when `TOKEN_WRITE_RETRY_S`
    would be over."""

    def __init__(self, now: float) -> None:
        self._backoff = Backoff(initial_s=0.05, max_s=1.0)
        self._deadline = now + TOKEN_WRITE_RETRY_S

    def delay_after(self, error: Exception, *, transient: bool, now: float) -> float:
        delay = self._backoff.next_delay()
        if not transient or now + delay > self._deadline:
            raise error
        logger.info("token write failed, sending it again in %.2f s: %r", delay, error)
        return delay


class PublisherCore:
    """What a publisher on `config` writes, and how: every rule of the producer SDK except
    sending. Calls are validated here, before any I/O (`InvalidProgressEvent`)."""

    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        self.wait = ReplicaWait(config.wait_replicas, config.wait_timeout_ms)

    def stage_event(self, event: StageEvent) -> PreparedEntry:
        return self.config.stage_event(event)

    def token(
        self, job_id: str, content: str, *, seq: int, node: str | None, attempt: int
    ) -> PreparedEntry:
        return self.config.token(job_id, content, seq=seq, node=node, attempt=attempt)

    def token_writing(
        self,
        job_id: str,
        tokens: object,
        *,
        node: str | None = None,
        attempt: int = 0,
        coalesce_ms: float = DEFAULT_COALESCE_MS,
        first_seq: int = FIRST_TOKEN_SEQ,
    ) -> TokenWriting:
        """A run of tokens, its settings validated before the first delta is read."""
        refuse_text(tokens)
        run = token_run(job_id, node=node, attempt=attempt, first_seq=first_seq)
        return TokenWriting(self.config.tokens(run, coalesce_ms=coalesce_ms))

    def script_call(self, entry: PreparedEntry) -> tuple[list[str], list[str | int]]:
        return script_arguments(entry, self.config)

    def pipelined(
        self, sha: str, entries: Sequence[PreparedEntry], on_node: dict[str, Any]
    ) -> list[Command]:
        """The commands that append `entries` in one round trip, each once, in order, then
        WAIT on the same connection when replicas must have them."""
        commands: list[Command] = []
        for entry in entries:
            keys, args = self.script_call(entry)
            commands.append((("EVALSHA", sha, len(keys), *keys, *args), {}))
        if self.wait.replicas:
            # On the connection that wrote: WAIT counts the replicas that have its writes.
            commands.append((("WAIT", self.wait.replicas, self.wait.timeout_ms), on_node))
        return commands

    def entry_ids(self, replies: list[Any]) -> list[str]:
        """The entry ids the pipeline's replies give; `ReplicasBehind` when WAIT fell short
        (the entries are written: sending them again returns the same ids)."""
        if self.wait.replicas:
            acked = int(replies.pop())
            if acked < self.wait.replicas:
                raise ReplicasBehind(
                    f"{acked} of {self.wait.replicas} replicas acknowledged the write within "
                    f"{self.wait.timeout_ms} ms"
                )
        return [entry_id(reply) for reply in replies]


def entry_id(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
