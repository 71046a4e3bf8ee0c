"""Redis adapter of `StateStore`: holds the records of the jobs it wrote (under the shard's
fencing token), loads those of a batch's other jobs in one pipeline, settles the batch with
`domain.settle`, and stores the writes with one fenced `store_batch.lua` call."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.connections.replica_wait import ReplicaWait
from eco_router.adapters.redis.connections.round_trips import round_trips
from eco_router.adapters.redis.connections.slots import by_slot, gather_all
from eco_router.adapters.redis.errors import port_error, redis_errors
from eco_router.adapters.redis.keys import GroupKeys, JobKeys
from eco_router.adapters.redis.router.store_flags import (
    HISTORY_RENEW,
    MARKERS_RENEW,
    STATE_LAST,
    STATE_OWN,
    STATE_RENEW,
    TEXT_APPEND,
    TEXT_FORGET,
    TEXT_KEYS,
    TEXT_RENEW,
    TEXT_SET,
    TEXT_WRITES,
)
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.port_values import Applied, EncodedEvent, JobView, ReadStart
from eco_router.application.ports import StateStore
from eco_router.domain.event import StreamEntryId
from eco_router.domain.event_size import DEFAULT_HISTORY_MAX_BYTES
from eco_router.domain.settle import (
    JobKey,
    JobWrite,
    Limits,
    Marker,
    StoredJob,
    StoredText,
    gone_candidates,
    settle,
)
from eco_router.domain.streams import StreamFamily, hash_tag
from eco_router.domain.text import DEFAULT_TEXT_MAX_BYTES, JobText, TextRun
from eco_router.domain.verdict import Judgement

# Besides the seqs' and lifecycle markers, the markers hash holds the newest applied stage
# seq and event id ("last", "last_id"), whether the job ended ("ended": "0" no, "1" yes, "2"
# and a token came after), each history payload's size ("sizes": "12,40,..."), their sum
# ("history_bytes", kept for routers of the previous release) and when the TTLs were last
# renewed ("renewed", server seconds).
_TEXT = ("attempt", "seq", "id", "entry", "bytes", "full", "node", "run_at", "runs")
_ENDED = {b"1": (True, False), b"2": (True, True)}
# The record of a job no key is kept of.
_NEW = StoredJob()
# Jobs whose records a store holds at most, by default.
DEFAULT_HELD_JOBS = 50_000


@dataclass(slots=True)
class _Held:
    """A job's record as the store last loaded or wrote it, valid while its shard's fencing
    token is `token` and until `expires` (server seconds: its keys may expire after)."""

    stream: str
    token: int
    record: StoredJob
    renewed: int | None
    expires: int


@functools.lru_cache(maxsize=16_384)
def _job_keys(domain: str, job_id: str, stream: str) -> tuple[str, str, str, str, str]:
    """A job's state, history, markers, text state and text keys, named once."""
    job = JobKeys.of(domain, job_id, stream)
    return (job.state, job.history, job.markers, job.text_state, job.text)


class RedisLuaStateStore(StateStore):
    """Keeps job records in Redis and applies the writes `settle` decides: one pipelined read
    of the batch's jobs it neither holds nor takes for new (a second, rarely, for a history
    whose sizes were not kept), then one `store_batch.lua` call that checks the fence, the
    read order and what was taken for granted (jobs new, marked entries still held), and
    writes; when such a check fails, nothing is written, and what failed is read and the
    batch settled and stored again. A job's history keeps at most `history_size` payloads and
    `history_max_bytes` bytes (the newest always). With `replica_wait`, a batch counts as
    applied (and is published) only once that many replicas have it.

    The lease holder is the only writer of its shards' jobs, so the store holds the records
    of up to `held_jobs` jobs (the least recently used go first) and loads only those it does
    not hold: a record is held under the shard's fencing token it was loaded and written
    under, and only while its keys are sure to live (their TTLs were renewed recently enough).
    A new token, a store call that failed, or one that was fenced or found a gap in the read
    order drops the shard's records."""

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
        held_jobs: int = DEFAULT_HELD_JOBS,
    ) -> None:
        self._redis = redis
        self._replica_wait = replica_wait or ReplicaWait()
        self._script = redis.register_script(load_lua("store_batch.lua"))
        self._read_text = redis.register_script(load_lua("read_text.lua"))
        self._trips = round_trips(redis)
        self._group = group
        self._limits = Limits(history_size, history_max_bytes, text_max_bytes)
        self._state_ttl = state_ttl_s
        # TTLs are renewed at most this often, and kept this much longer: each key lives at
        # least its TTL after the job's last event.
        self._renew_every = min(60, state_ttl_s // 10)
        self._history_ttl = state_ttl_s + self._renew_every
        self._markers_ttl = markers_ttl_s + self._renew_every
        # A record is held this long after its keys' TTLs were renewed, well inside them.
        self._hold_s = min(state_ttl_s, markers_ttl_s) - self._renew_every
        self._held_jobs = held_jobs
        self._held: OrderedDict[JobKey, _Held] = OrderedDict()
        # Per shard, the fencing token its held records were loaded and written under.
        self._tokens: dict[str, int] = {}
        self._group_keys = GroupKeys(group)
        self._epoch_keys: dict[str, str] = {}
        self._families = {f.domain: f for f in families}
        # Per slot's hash tag, the server's time as its last reply gave it, and when.
        self._server_clocks: dict[str | None, tuple[float, float]] = {}
        self._to_view: list[tuple[JobKeys, asyncio.Future[JobView]]] = []
        self._viewing: asyncio.Task[None] | None = None

    async def apply(
        self,
        events: Sequence[EncodedEvent],
        fence: Mapping[str, int],
        in_order: Mapping[str, ReadStart] | None = None,
    ) -> Applied:
        """One load and one store for the batch; on tagged shards one each per slot, issued
        together."""
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
        """Load, settle and store the events of `fence`'s shards (one slot)."""
        shards = list(fence)
        if not shards:
            return Applied([None] * len(events), stamps=[None] * len(events))
        for stream, token in fence.items():
            if self._tokens.get(stream) != token:
                self._forget((stream,))
                self._tokens[stream] = token
        shard_index = {stream: n for n, stream in enumerate(shards, 1)}
        mine = [n for n, e in enumerate(events) if e.event.stream in shard_index]
        batch = [events[n] for n in mine]
        tag = hash_tag(shards[0])
        now = self._server_now(tag)
        # Jobs assumed new that were not: read, and the batch settled again.
        to_read: set[JobKey] = set()
        # Entries assumed held by their stream that were not, looked up, and those found gone.
        looked_up: set[tuple[str, str]] = set()
        gone: frozenset[str] = frozenset()
        while True:
            try:
                with redis_errors("load job records"):
                    records, renewed, assumed, loaded = await self._records(batch, now, to_read)
            except BaseException:
                self._forget(shards)
                raise
            # An entry a marker names is assumed still held by its stream (the store call
            # checks): only one that is not is looked up, and the batch settled again.
            held_entries = gone_candidates(batch, records) - looked_up
            settled = settle(batch, records, self._limits, gone)
            keys = [self._epoch_key(stream) for stream in shards] + shards
            args: list[str | int | bytes] = [self._group, len(shards)]
            for stream, token in fence.items():
                # A shard's token, and where its read began, what it brought first and who
                # read it.
                start = starts.get(stream)
                checked = (
                    f"{token} ({start.after} {start.first} {start.consumer}" if start else token
                )
                args.append(checked)
            values: list[str | int | bytes] = []
            # Where each written job's keys begin in `keys` (1-based).
            key_at: dict[JobKey, int] = {}
            for write in settled.writes:
                job = write.job
                key_at[job] = len(keys) + 1
                renewed[job] = self._write(
                    write,
                    records[job],
                    renewed.get(job),
                    now,
                    shard_index[write.stream],
                    keys,
                    values,
                )
            absent = _assumed_keys(assumed, key_at, keys)
            args.append(" ".join(map(str, absent)))
            args.append(" ".join(f"{shard_index[s]} {entry}" for s, entry in held_entries))
            args += (self._state_ttl, self._history_ttl, self._markers_ttl, len(settled.writes))
            try:
                with redis_errors("store batch"):
                    reply = await self._replica_wait.call(
                        self._redis, self._script, keys, args + values, trips=self._trips
                    )
                    fenced, gaps, (seconds, micros), present, missing = reply
                    if missing:
                        asked = {_missing(shards, m) for m in missing}
                        looked_up |= asked
                        gone |= await self._gone(asked)
            except BaseException:
                # Written or not, the records held may no longer be what the keys hold.
                self._forget(shards)
                raise
            if not present and not missing:
                break
            to_read.update(absent[key] for key in present)
        self._server_clocks[tag] = (int(seconds) + int(micros) / 1e6, time.monotonic())
        skipped = {shards[n - 1] for n in (*fenced, *gaps)}
        self._forget(skipped)
        self._hold(settled.writes, records, loaded, renewed, fence, skipped)
        judgements: list[Judgement | None] = [None] * len(events)
        stamps: list[bytes | None] = [None] * len(events)
        for n, judgement, fields in zip(mine, settled.judgements, settled.stamps, strict=True):
            if events[n].event.stream not in skipped:
                judgements[n], stamps[n] = judgement, fields
        return Applied(
            judgements,
            frozenset(shards[n - 1] for n in fenced),
            frozenset(shards[n - 1] for n in gaps),
            stamps,
        )

    def _epoch_key(self, stream: str) -> str:
        key = self._epoch_keys.get(stream)
        if key is None:
            key = self._epoch_keys[stream] = self._group_keys.epoch(stream)
        return key

    def _server_now(self, tag: str | None) -> int:
        """The server's time in seconds, from its last reply and the time since (TIME is
        refused in a Cluster's pipelines); this machine's before any reply."""
        known = self._server_clocks.get(tag)
        if known is None:
            return int(time.time())
        server_s, at = known
        return int(server_s + time.monotonic() - at)

    async def _records(
        self, batch: Sequence[EncodedEvent], now: int, to_read: Collection[JobKey]
    ) -> tuple[
        dict[JobKey, StoredJob],
        dict[JobKey, int | None],
        dict[JobKey, tuple[str, str, str, str, str]],
        dict[JobKey, str],
    ]:
        """The records of the batch's jobs, held or loaded, and when each job's TTLs were
        last renewed (server seconds). A held text's bytes are loaded only when a terminal
        event may check them. A job neither held nor in `to_read` whose first event here is
        its first (a stage event of seq 0) is assumed new and not read: its keys, returned,
        are checked absent by the store call. Last, the stream of each job loaded."""
        records: dict[JobKey, StoredJob] = {}
        renewed: dict[JobKey, int | None] = {}
        assumed: dict[JobKey, tuple[str, str, str, str, str]] = {}
        asked: dict[JobKey, tuple[tuple[str, str, str, str, str], bool]] = {}
        texts: dict[JobKey, str] = {}
        read_from: dict[JobKey, str] = {}
        held = self._held
        for item in batch:
            event = item.event
            job = event.job_key
            if job not in records and job not in asked:
                holding = held.get(job)
                if holding is not None and now < holding.expires:
                    records[job] = holding.record
                    renewed[job] = holding.renewed
                elif event.seq == 0 and not event.is_token and job not in to_read:
                    keys = _job_keys(event.domain, event.job_id, event.stream)
                    records[job] = _NEW
                    renewed[job] = None
                    assumed[job] = keys
                else:
                    asked[job] = (_job_keys(event.domain, event.job_id, event.stream), False)
                    read_from[job] = event.stream
            if not event.is_terminal:
                continue
            if job in asked:
                asked[job] = (asked[job][0], True)
            elif job not in texts and job not in assumed:
                text = records[job].text
                if text is not None and text.content is None:
                    texts[job] = _job_keys(event.domain, event.job_id, event.stream)[4]
        if asked or texts:
            loaded, loaded_renewed = await self._load(asked, texts, records)
            records.update(loaded)
            renewed.update(loaded_renewed)
        return records, renewed, assumed, read_from

    async def _load(
        self,
        asked: Mapping[JobKey, tuple[tuple[str, str, str, str, str], bool]],
        texts: Mapping[JobKey, str],
        held: Mapping[JobKey, StoredJob],
    ) -> tuple[dict[JobKey, StoredJob], dict[JobKey, int]]:
        """The whole records of the `asked` jobs (a text's bytes when asked too), the bytes
        of the `held` records' texts named by `texts`, and when each asked job's TTLs were
        last renewed (server seconds)."""
        # On the store's kept connection, as the store call goes: through the pool a
        # pipeline costs the client about twice its round trip.
        async with self._redis.pipeline(transaction=False) as pipe:
            for keys, with_bytes in asked.values():
                pipe.hgetall(keys[2])
                pipe.llen(keys[1])
                pipe.hmget(keys[3], _TEXT)
                if with_bytes:
                    pipe.get(keys[4])
            for text_key in texts.values():
                pipe.get(text_key)
            answered = await self._trips.execute(pipe)
        refused = next((r for r in answered if isinstance(r, Exception)), None)
        if refused is not None:
            raise refused
        replies = iter(answered)
        records: dict[JobKey, StoredJob] = {}
        renewed: dict[JobKey, int] = {}
        unsized: dict[JobKey, str] = {}
        for job, (keys, with_bytes) in asked.items():
            known: dict[bytes, bytes] = next(replies)
            length = next(replies)
            text = _text(next(replies), (next(replies) or b"") if with_bytes else None)
            last = _int(known.pop(b"last", None))
            last_seq = None if last is None or last < 0 else last
            last_id = _int(known.pop(b"last_id", None))
            ended, after_end = _ENDED.get(known.pop(b"ended", b"0"), (False, False))
            sizes = _sizes(known.pop(b"sizes", None), known.pop(b"history_bytes", None), length)
            if sizes is None:
                unsized[job] = keys[1]
                sizes = ()
            at = known.pop(b"renewed", None)
            if at is not None:
                renewed[job] = int(at)
            markers: dict[int, Marker] = {}
            lifecycle: dict[str, Marker] = {}
            for field_name, value in known.items():
                name = field_name.decode()
                if name.isdigit() or name.startswith("-"):
                    markers[int(name)] = _marker(value, name)
                else:
                    lifecycle[name] = _marker(value, name)
            records[job] = StoredJob(
                last_seq=last_seq,
                last_id=last_id if last_id is not None else last_seq,
                markers=markers,
                lifecycle=lifecycle,
                ended=ended,
                written_after_end=after_end,
                history_sizes=sizes,
                text=text,
            )
        for job in texts:
            record = held[job]
            assert record.text is not None
            records[job] = record._replace(text=replace(record.text, content=next(replies) or b""))
        if unsized:
            # A history kept by a release that did not keep its sizes: counted once.
            async with self._redis.pipeline(transaction=False) as pipe:
                for history in unsized.values():
                    pipe.lrange(history, 0, -1)
                for job, payloads in zip(unsized, await pipe.execute(), strict=True):
                    sizes = tuple(len(p) for p in payloads)
                    records[job] = records[job]._replace(history_sizes=sizes)
        return records, renewed

    def _hold(
        self,
        writes: Sequence[JobWrite],
        records: Mapping[JobKey, StoredJob],
        loaded: Mapping[JobKey, str],
        renewed: Mapping[JobKey, int | None],
        fence: Mapping[str, int],
        skipped: Collection[str],
    ) -> None:
        """Hold the records loaded and written, as stored, under their shards' tokens; the
        least recently used beyond `held_jobs` go. Those held and not written stay as held."""
        held = self._held
        for job, stream in loaded.items():
            self._hold_one(job, stream, records[job], renewed.get(job), fence, skipped)
        for write in writes:
            self._hold_one(
                write.job, write.stream, write.record, renewed.get(write.job), fence, skipped
            )
        while len(held) > self._held_jobs:
            held.popitem(last=False)

    def _hold_one(
        self,
        job: JobKey,
        stream: str,
        record: StoredJob,
        at: int | None,
        fence: Mapping[str, int],
        skipped: Collection[str],
    ) -> None:
        held = self._held
        if at is None or stream in skipped:
            # Not known to be what the keys hold, or not how long they live.
            held.pop(job, None)
            return
        text = record.text
        if text is not None and text.content is not None:
            # The bytes are read again for the next check: held, a record's size does not
            # grow with its text.
            record = record._replace(text=replace(text, content=None))
        holding = held.get(job)
        if holding is None:
            held[job] = _Held(stream, fence[stream], record, at, at + self._hold_s)
            return
        holding.token, holding.record = fence[stream], record
        holding.renewed, holding.expires = at, at + self._hold_s
        held.move_to_end(job)

    def _forget(self, streams: Collection[str]) -> None:
        """Drop the records held of `streams`' jobs, and the tokens they were held under."""
        if not streams:
            return
        for stream in streams:
            self._tokens.pop(stream, None)
        held = self._held
        for job in [job for job, h in held.items() if h.stream in streams]:
            del held[job]

    @property
    def held_jobs(self) -> int:
        """How many jobs' records the store holds."""
        return len(self._held)

    async def _gone(self, entries: Collection[tuple[str, str]]) -> frozenset[str]:
        """Those of the (stream, entry) pairs whose stream never held the entry: not there,
        no deletion went as far (XDEL), and not before its first entry (trimmed)."""
        asked = sorted(entries)
        streams = sorted({stream for stream, _ in asked})
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream, entry in asked:
                pipe.xrange(stream, entry, entry, count=1)
            # One XINFO STREAM per stream, however many of its entries are asked about.
            for stream in streams:
                pipe.xinfo_stream(stream)
            replies = await self._trips.execute(pipe)
        infos = dict(zip(streams, replies[len(asked) :], strict=True))
        gone = set()
        for (stream, entry), held in zip(asked, replies, strict=False):
            info = infos[stream]
            if isinstance(held, Exception) or held or isinstance(info, Exception):
                continue
            deleted = _get(info, "max-deleted-entry-id")
            first = _get(info, "first-entry")
            if deleted is None or not first:
                continue
            at = StreamEntryId.parse(entry)
            if at > _entry_id(deleted) and at > _entry_id(first[0]):
                gone.add(entry)
        return frozenset(gone)

    def _write(
        self,
        write: JobWrite,
        before: StoredJob,
        renewed: int | None,
        now: int,
        shard: int,
        keys: list[str],
        values: list[str | int | bytes],
    ) -> int | None:
        """One job's keys and values as the script takes them; TTLs renewed at most once per
        `_renew_every` seconds (a clock that went back renews too). Returns when the job's
        TTLs were last renewed once it is stored (server seconds)."""
        due = renewed is None or now - renewed >= self._renew_every or now < renewed
        record = write.record
        text = record.text
        flags = 0
        text_value: bytes | None = None
        text_fields: list[str | int | bytes] = []
        text_changed = text is not None and text != before.text
        if text is not None and text_changed:
            if write.text_restarted and (before.text is not None or write.text_appended):
                flags |= TEXT_SET
                text_value = write.text_appended
            elif write.text_appended:
                flags |= TEXT_APPEND
                text_value = write.text_appended
            # Only what changed: the fields of a text state read or written before are there.
            old = None if write.text_restarted else before.text
            text_fields = [
                "seq",
                -1 if text.last_seq is None else text.last_seq,
                "bytes",
                text.size,
            ]
            if old is None or old.attempt != text.attempt:
                text_fields += ["attempt", text.attempt]
            if old is None or old.full != text.full:
                text_fields += ["full", 1 if text.full else 0]
            if old is None or (old.node, old.run_at, old.runs) != (
                text.node,
                text.run_at,
                text.runs,
            ):
                runs = "".join(f"{r.node}\t{r.start}\t{r.end}\n" for r in text.runs)
                text_fields += ["node", text.node, "run_at", text.run_at, "runs", runs]
            if text.last_id is not None and text.last_entry is not None:
                text_fields += ["id", text.last_id, "entry", text.last_entry]
            if text.last_id is None and before.text is not None:
                # No token of the new attempt was written: the old attempt's last one is not its.
                flags |= TEXT_FORGET
            if due or before.text is None or write.text_restarted:
                flags |= TEXT_RENEW
        appended = write.appended
        state = write.state
        if appended and state is appended[-1]:
            # The state is the payload just pushed: sent once.
            flags |= STATE_LAST
            state = None
        elif state is not None:
            flags |= STATE_OWN
        elif appended and due:
            # Lifecycle events alone: the state stays, and lives as long as the history.
            flags |= STATE_RENEW
        marks: list[str | int | bytes] = []
        for seq, marker in write.markers.items():
            marks += (seq, marker.entry.encode() + b" " + marker.stamp)
        for name, marker in write.lifecycle.items():
            marks += (name, marker.entry.encode() + b" " + marker.stamp)
        if appended:
            if due or not before.history_sizes:
                flags |= HISTORY_RENEW
            sizes = record.history_sizes
            marks += ("sizes", ",".join(map(str, sizes)), "history_bytes", sum(sizes))
            if record.last_seq is not None:
                marks += ("last", record.last_seq)
        if record.last_id is not None and record.last_id != before.last_id:
            marks += ("last_id", record.last_id)
        if (record.ended, record.written_after_end) != (before.ended, before.written_after_end):
            marks += ("ended", "2" if record.written_after_end else "1" if record.ended else "0")
        if marks and due:
            marks += ("renewed", now)
            flags |= MARKERS_RENEW
            # The keys of the kind that did not come are renewed with the others, or they
            # would expire while the job goes on.
            if not appended:
                flags |= HISTORY_RENEW
            if not text_changed and text is not None:
                flags |= TEXT_RENEW
            renewed = now
        job_keys = _job_keys(*write.job, write.stream)
        if flags & TEXT_WRITES or text_fields:
            flags |= TEXT_KEYS
            keys += job_keys
        else:
            keys += job_keys[:3]
        values += (shard, flags, len(appended), len(marks), len(text_fields), write.dropped)
        values += appended
        if state is not None:
            values.append(state)
        if text_value is not None:
            values.append(text_value)
        values += marks
        values += text_fields
        return renewed

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


def _missing(shards: Sequence[str], named: bytes) -> tuple[str, str]:
    """A (stream, entry) pair as the store call names one it did not find: "<shard> <entry>"."""
    shard, _, entry = named.decode().partition(" ")
    return shards[int(shard) - 1], entry


def _assumed_keys(
    assumed: Mapping[JobKey, tuple[str, str, str, str, str]],
    key_at: Mapping[JobKey, int],
    keys: list[str],
) -> dict[int, JobKey]:
    """The 1-based indices, in `keys`, of the assumed jobs' history, markers and text state
    keys to check absent (a job may have a text state alone: its first token filled it):
    where the job's write named them (from `key_at` on: state, history, markers, text state),
    else added to `keys`."""
    checked: dict[int, JobKey] = {}
    for job, (_, history, markers, text_state, _) in assumed.items():
        at = key_at.get(job)
        named = {} if at is None else {history: at + 1, markers: at + 2}
        if at is not None and len(keys) > at + 2 and keys[at + 2] == text_state:
            named[text_state] = at + 3
        for key in (history, markers, text_state):
            index = named.get(key)
            if index is None:
                keys.append(key)
                index = len(keys)
            checked[index] = job
    return checked


def _entry_ms(entry: bytes) -> int | None:
    ms = entry.partition(b"-")[0]
    return int(ms) if ms.isdigit() else None


def _int(value: bytes | None) -> int | None:
    return None if value is None else int(value)


def _marker(value: bytes, name: str) -> Marker:
    """A marker as kept, "<entry> <stamp>"; one written before stamps is the entry alone,
    and its seq was its id."""
    entry, space, stamp = value.partition(b" ")
    if not space:
        return Marker(value.decode(), b'"event_id":%s,' % name.encode())
    return Marker(entry.decode(), stamp)


def _sizes(sizes: bytes | None, total: bytes | None, length: int) -> tuple[int, ...] | None:
    """The history's payload sizes as kept, when they agree with its length and the byte
    count (a router of the previous release keeps the count only); None: to be counted."""
    if length == 0:
        return ()
    if sizes is None:
        return None
    kept = tuple(int(size) for size in sizes.split(b","))
    if len(kept) != length or total is None or sum(kept) != int(total):
        return None
    return kept


def _text(known: list[bytes | None], content: bytes | None) -> StoredText | None:
    """A text's state as kept, with its bytes (None: not loaded)."""
    attempt, seq, last_id, entry, size, full, node, run_at, runs = known
    if attempt is None:
        return None
    last_seq = int(seq) if seq is not None else -1
    closed = [line.split(b"\t") for line in runs.splitlines() if line] if runs else []
    return StoredText(
        attempt=int(attempt),
        last_seq=None if last_seq < 0 else last_seq,
        last_id=_int(last_id),
        last_entry=None if entry is None else entry.decode(),
        content=content,
        size=int(size or 0),
        runs=tuple(TextRun(n.decode(), int(a), int(b)) for n, a, b in closed),
        node=(node or b"").decode(),
        run_at=int(run_at or 0),
        full=full == b"1",
    )


def _get(info: Any, name: str) -> Any:
    """A field of a parsed XINFO STREAM reply, by its name as text or bytes."""
    if not isinstance(info, dict):
        return None
    value = info.get(name)
    return info.get(name.encode()) if value is None else value


def _entry_id(value: Any) -> StreamEntryId:
    return StreamEntryId.parse(value.decode() if isinstance(value, bytes) else str(value))
