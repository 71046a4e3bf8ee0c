"""The producer's rules without I/O, for every publisher (blocking, asyncio, in memory): what
each call appends, the commands that append it, what their replies mean, how deltas become
batches of tokens, how a run of them is numbered, counted and retried. A publisher only
reads its source, sends and waits."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eco_router.adapters.progress_entries import (
    PreparedEntry,
    PreparedTokens,
    ProducerConfig,
    delta_cost,
    delta_text,
)
from eco_router.application.backoff import Backoff
from eco_router.application.errors import ReplicasBehind
from eco_router.domain.event import FIRST_TOKEN_SEQ
from eco_router.domain.progress import InvalidProgressEvent, StageEvent
from eco_router.domain.token_entries import (
    DEFAULT_COALESCE_MS,
    Coalescing,
    PendingText,
    TokensPublished,
    token_run,
)

logger = logging.getLogger(__name__)

# A batch of tokens holds the only copy of its deltas (a model's stream is read once): a write
# lost with its connection, or refused mid-failover, is sent again for up to this long before
# its error is raised. An entry of it that had landed is not added again: its marker answers.
TOKEN_WRITE_RETRY_S = 10.0

# Entries in one round trip at most: a long list of deltas goes in a few pipelines, not one
# that holds the server for its whole length.
MAX_BATCH = 256

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


def refuse_text(tokens: object) -> None:
    """A `str` is an iterable of characters: passing one is a mistake, not a stream."""
    if isinstance(tokens, (str, bytes, bytearray)):
        raise InvalidProgressEvent(
            "tokens must be an iterable of deltas, not one text: use publish_token for one"
        )


class TokenBatching:
    """The deltas of one run turned into batches of entry texts, without I/O: a shell feeds
    what its source gave and when (`arrived`, `ended`, `failed`, `tick`) and writes what
    `batches` hands, whatever it reads with (a thread, an event loop).

    - Deltas merge as `Coalescing` rules; an empty delta (a chunk without text) is skipped.
    - A batch holds at most `MAX_BATCH` entries.
    - The source's end, its failure, or an item that is not a delta close the pending
      entry: what came before is written, then the failure is raised (`raise_failure`), and
      nothing the source gives after it is taken.
    """

    def __init__(self, rule: Coalescing) -> None:
        self._rule = rule
        self._pending: PendingText | None = None
        self._ready: list[str] = []
        self._failure: BaseException | None = None
        self.over = False

    def arrived(self, item: object, now: float) -> None:
        """The source gave `item` at `now`."""
        if self.over:
            return
        try:
            text = delta_text(item)
        except InvalidProgressEvent as error:
            self.failed(error)
            return
        if not text:  # an empty delta would cost an entry and change nothing
            return
        self._pending, closed = self._rule.add(self._pending, text, cost=delta_cost(text), now=now)
        if closed is not None:
            self._ready.append(closed)

    def ended(self) -> None:
        """The source is exhausted."""
        self._close()

    def failed(self, error: BaseException) -> None:
        """The source raised `error` (or gave what is not a delta)."""
        if not self.over:
            self._failure = error
            self._close()

    def due_in(self, now: float) -> float | None:
        """How long until the pending entry is due (None: no entry is pending)."""
        if self._pending is None:
            return None
        return max(self._rule.due_at(self._pending) - now, 0.0)

    def tick(self, now: float) -> None:
        """Close the pending entry if its window is over at `now`."""
        if self._pending is not None and now >= self._rule.due_at(self._pending):
            self._ready.append(self._pending.text)
            self._pending = None

    def batches(self) -> list[list[str]]:
        """The closed entries not handed yet, in batches of at most `MAX_BATCH`."""
        ready, self._ready = self._ready, []
        return [ready[start : start + MAX_BATCH] for start in range(0, len(ready), MAX_BATCH)]

    def full_batches(self) -> list[list[str]]:
        """`batches`, only once a whole batch is closed (a source that is all there: fewer
        round trips)."""
        return self.batches() if len(self._ready) >= MAX_BATCH else []

    def raise_failure(self) -> None:
        """Raise what stopped the source, if anything did."""
        if self._failure is not None:
            raise self._failure

    def _close(self) -> None:
        if self._pending is not None:
            self._ready.append(self._pending.text)
            self._pending = None
        self.over = True


@dataclass(slots=True)
class TokenTally:
    """What a run has written so far."""

    first_seq: int
    entries: int = 0
    characters: int = 0
    text_bytes: int = 0

    def add(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.entries += 1
            self.characters += len(text)
            self.text_bytes += len(text.encode())

    def published(self) -> TokensPublished:
        last = self.first_seq + self.entries - 1 if self.entries else None
        return TokensPublished(self.entries, self.first_seq, last, self.characters, self.text_bytes)


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
    """Sending one batch of tokens until it lands (it holds the only copy of its deltas):

    - A pipeline refused for want of the script (NOSCRIPT: a pipeline does not load it by
      itself) is sent again at once, the script loaded first (`script_to_load`). None of its
      calls ran; were some to have, their markers make the second try return their first ids.
    - An error that passes by retrying (`transient`) is sent again after a growing delay, for
      up to `TOKEN_WRITE_RETRY_S`; any other error is raised, and so is one past that time.
    """

    def __init__(self, now: float) -> None:
        self._backoff = Backoff(initial_s=0.05, max_s=1.0)
        self._deadline = now + TOKEN_WRITE_RETRY_S
        self._script_missing = False
        self._script_loaded = False

    def delay_after(
        self, error: Exception, *, transient: bool, now: float, no_script: bool = False
    ) -> float:
        """How long to wait before sending the batch again, or `error` raised."""
        if no_script and not self._script_loaded:
            self._script_missing = self._script_loaded = True
            return 0.0
        delay = self._backoff.next_delay()
        if not transient or now + delay > self._deadline:
            raise error
        logger.info("token write failed, sending it again in %.2f s: %r", delay, error)
        return delay

    def script_to_load(self) -> bool:
        """Whether to load the script before the next send (once, after a NOSCRIPT)."""
        missing, self._script_missing = self._script_missing, False
        return missing


class PublisherCore:
    """What a publisher on `config` writes, and how: every rule of the producer SDK except
    sending. Calls are validated here, before any I/O (`InvalidProgressEvent`)."""

    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        # Replicas that must have each write before a call returns (0: none), and how long
        # WAIT waits for them.
        self.replicas = config.wait_replicas
        self.timeout_ms = config.wait_timeout_ms

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
        if self.replicas:
            # On the connection that wrote: WAIT counts the replicas that have its writes.
            commands.append((("WAIT", self.replicas, self.timeout_ms), on_node))
        return commands

    def entry_ids(self, replies: list[Any]) -> list[str]:
        """The entry ids the pipeline's replies give; `ReplicasBehind` when WAIT fell short
        (the entries are written: sending them again returns the same ids)."""
        if self.replicas:
            acked = int(replies.pop())
            if acked < self.replicas:
                raise ReplicasBehind(
                    f"{acked} of {self.replicas} replicas acknowledged the write within "
                    f"{self.timeout_ms} ms"
                )
        return [entry_id(reply) for reply in replies]


def entry_id(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
