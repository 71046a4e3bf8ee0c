"""Lua-backed Redis adapter of `StateStore`."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence

from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.connections.replica_wait import ReplicaWait
from eco_router.adapters.redis.connections.round_trips import round_trips
from eco_router.adapters.redis.connections.slots import by_slot, gather_all
from eco_router.adapters.redis.errors import port_error, redis_errors
from eco_router.adapters.redis.keys import GroupKeys, JobKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.port_values import Applied, EncodedEvent, JobView, ReadStart
from eco_router.application.ports import StateStore
from eco_router.domain.event_size import DEFAULT_HISTORY_MAX_BYTES
from eco_router.domain.streams import StreamFamily
from eco_router.domain.text import DEFAULT_TEXT_MAX_BYTES, JobText, TextRun
from eco_router.domain.verdict import (
    DUPLICATE,
    NEW_APPLY,
    NEW_IN_PLACE_OF_GONE,
    NEW_REPUBLISH,
    NEW_RESTART,
    STALE,
    STALE_AFTER_END,
    TEXT_FILLED,
    TEXT_FULL,
    Judgement,
    Verdict,
)

_JUDGEMENTS = {
    ord("0"): NEW_APPLY,
    ord("1"): NEW_REPUBLISH,
    ord("2"): DUPLICATE,
    ord("3"): STALE,
    ord("5"): NEW_IN_PLACE_OF_GONE,
    ord("6"): NEW_RESTART,
    ord("7"): TEXT_FULL,
    ord("8"): TEXT_FILLED,
    ord("9"): Judgement(Verdict.TEXT_FULL, restarts=True, fills=True),
    ord("a"): STALE_AFTER_END,
}


@functools.lru_cache(maxsize=16_384)
def _apply_keys(domain: str, job_id: str, stream: str) -> tuple[str, str, str, str, str]:
    """The keys `apply_batch.lua` takes for a job, named once for the batches that follow."""
    job = JobKeys.of(domain, job_id, stream)
    return (job.state, job.history, job.markers, job.text_state, job.text)


class RedisLuaStateStore(StateStore):
    """Judges and applies a whole batch with one EVALSHA of `apply_batch.lua`; a job's history
    keeps at most `history_size` payloads and `history_max_bytes` bytes (the newest always).
    With `replica_wait`, a batch counts as applied (and is published) only once that many
    replicas have it."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        families: Sequence[StreamFamily],
        group: str,
        state_ttl_s: int,
        markers_ttl_s: int,
        history_size: int,
        history_max_bytes: int = DEFAULT_HISTORY_MAX_BYTES,
        text_max_bytes: int = DEFAULT_TEXT_MAX_BYTES,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        self._redis = redis
        self._replica_wait = replica_wait or ReplicaWait()
        self._script = redis.register_script(load_lua("apply_batch.lua"))
        self._read_text = redis.register_script(load_lua("read_text.lua"))
        self._trips = round_trips(redis)
        self._head: list[str | int] = [
            state_ttl_s,
            markers_ttl_s,
            history_size,
            history_max_bytes,
            group,
            text_max_bytes,
        ]
        self._group_keys = GroupKeys(group)
        self._families = {f.domain: f for f in families}
        self._to_view: list[tuple[JobKeys, asyncio.Future[JobView]]] = []
        self._viewing: asyncio.Task[None] | None = None

    async def apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart] | None = None,
    ) -> Applied:
        """One script call for the batch; on tagged shards one per slot, issued together."""
        unfenced = {e.event.stream for e in events} - set(fence)
        starts = in_order or {}
        slots = by_slot(fence)
        if len(slots) <= 1:
            part = await self._apply(events, fence, starts)
            return Applied(part.judgements, part.fenced | unfenced, part.gaps, part.stamps)
        parts = await gather_all(self._apply(events, part, starts) for part in slots)
        # Each call judged its slot's events and left the others None.
        merged = [
            next((j for j in each if j is not None), None)
            for each in zip(*(p.judgements for p in parts), strict=True)
        ]
        stamps = [
            next((s for s in each if s is not None), None)
            for each in zip(*(p.stamps for p in parts), strict=True)
        ]
        return Applied(
            merged,
            frozenset().union(*(p.fenced for p in parts)) | unfenced,
            frozenset().union(*(p.gaps for p in parts)),
            stamps,
        )

    async def _apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        starts: Mapping[str, ReadStart],
    ) -> Applied:
        """One `apply_batch.lua` call for the events of `fence`'s shards (one slot)."""
        shards = list(fence)
        shard_index = {stream: n for n, stream in enumerate(shards, 1)}
        if not shards:
            return Applied([None] * len(events), stamps=[None] * len(events))
        keys = [self._group_keys.epoch(stream) for stream in shards]
        keys += shards
        args: list[str | int | bytes] = [*self._head, len(shards)]
        for stream, token in fence.items():
            # A shard's token, and where its read began, what it brought first and who read it.
            start = starts.get(stream)
            checked = f"{token} ({start.after} {start.first} {start.consumer}" if start else token
            args.append(checked)
        job_index: dict[tuple[str, str], int] = {}
        # The events' fields in one value, each payload in its own without its opening brace:
        # the script puts the stamp before it with one copy.
        lines: list[str] = []
        bodies: list[str | int | bytes] = []
        for item in events:
            event = item.event
            if event.stream not in shard_index:
                continue
            index = job_index.get(event.job_key)
            if index is None:
                index = job_index[event.job_key] = len(job_index) + 1
                keys += _apply_keys(event.domain, event.job_id, event.stream)
                args.append(shard_index[event.stream])
            if event.is_token:
                lines.append(
                    f"{index} t {event.seq} {event.stream_id} {event.attempt} {event.node or ''}\n"
                )
                bodies.append(event.content.encode())
            elif event.is_lifecycle:
                lines.append(f"{index} l {event.lifecycle_marker} {event.stream_id}\n")
                bodies.append(item.payload[1:])
            else:
                kind = "e" if event.is_terminal else "s"
                lines.append(f"{index} {kind} {event.seq} {event.stream_id}\n")
                bodies.append(item.payload[1:])
        args.append("".join(lines))
        with redis_errors("apply batch"):
            codes, fenced, gaps, stamps = await self._replica_wait.call(
                self._redis, self._script, keys, args + bodies, trips=self._trips
            )
        judged = iter([_JUDGEMENTS.get(code) for code in codes])
        stamped = iter([s or None for s in stamps])
        return Applied(
            [next(judged) if e.event.stream in shard_index else None for e in events],
            frozenset(shards[n - 1] for n in fenced),
            frozenset(shards[n - 1] for n in gaps),
            [next(stamped) if e.event.stream in shard_index else None for e in events],
        )

    async def view(self, domain: str, job_id: str) -> JobView:
        """Views asked for in the same turn of the loop (a burst of browsers opening their
        streams) are read in one pipeline, by a task of the store's own: a caller that gives
        up cancels nothing of the others'."""
        family = self._families.get(domain)
        # A domain no family has has no state; its plain key names find none either.
        job = JobKeys.in_family(family, job_id) if family else JobKeys.of(domain, job_id)
        viewed: asyncio.Future[JobView] = asyncio.get_running_loop().create_future()
        self._to_view.append((job, viewed))
        if self._viewing is None or self._viewing.done():
            self._viewing = asyncio.create_task(self._read_views(), name="read job views")
        return await viewed

    async def _read_views(self) -> None:
        while self._to_view:
            asked, self._to_view = self._to_view, []
            try:
                with redis_errors("read job view"):
                    async with self._redis.pipeline(transaction=False) as pipe:
                        for job, _ in asked:
                            pipe.get(job.state)
                            pipe.lrange(job.history, 0, -1)
                            pipe.hmget(job.text_state, "id", "entry")
                        replies = await pipe.execute(raise_on_error=False)
            except Exception as error:
                for _, viewed in asked:
                    if not viewed.done():
                        viewed.set_exception(error)
                continue
            for n, (job, viewed) in enumerate(asked):
                state, history, text = replies[3 * n : 3 * n + 3]
                if viewed.done():
                    continue
                # One job's keys refused (a key of the wrong type) fail that view alone.
                refused = next(
                    (r for r in (state, history, text) if isinstance(r, Exception)), None
                )
                if refused is not None:
                    viewed.set_exception(port_error(refused, "read job view", key=job.state))
                else:
                    last_id, entry = text
                    viewed.set_result(
                        JobView(
                            state=state,
                            history=list(history),
                            text_last_id=None if last_id is None else int(last_id),
                            text_written_ms=None if entry is None else _entry_ms(entry),
                        )
                    )

    async def text(self, domain: str, job_id: str) -> JobText | None:
        """One script call: the text and what is known of it, as of one moment."""
        family = self._families.get(domain)
        job = JobKeys.in_family(family, job_id) if family else JobKeys.of(domain, job_id)
        with redis_errors("read job text"):
            reply = await self._read_text(keys=[job.text_state, job.text])
        if not reply:
            return None
        attempt, seq, last_id, full, node, run_at, runs, size, text = reply
        closed = [line.split(b"\t") for line in runs.splitlines() if line] if runs else []
        spans = [TextRun(n.decode(), int(a), int(b)) for n, a, b in closed]
        if node:
            spans.append(TextRun(node.decode(), int(run_at), int(size)))
        return JobText(
            text=text,
            last_id=int(last_id),
            last_seq=int(seq),
            attempt=int(attempt),
            runs=tuple(spans),
            full=full == b"1",
        )


def _entry_ms(entry: bytes) -> int | None:
    ms = entry.partition(b"-")[0]
    return int(ms) if ms.isdigit() else None
