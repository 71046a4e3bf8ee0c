"""Where the router's CPU per event goes in `domain.settle`, with no store and no Redis.

Run from the repository root: `.venv/bin/python -m bench.settle_profile [--jobs 60]
[--events 20000] [--batch 100] [--rounds 7] [--chat-every 3] [--seed 1] [--profile]`.

A backlog as the router reads it: `--jobs` jobs at a time, every `--chat-every`-th a chat job
(queued, running, tokens of an answer from one node or two, done with the text's check), the
others scan jobs (queued, scanning with progress, writing, done with a result), now and then
a cancel request; ~5% of the entries written again (a producer's retry: same seq, a new
entry) or read again (a redelivery: the same entry), ~3% held back behind 1-3 newer entries
of their job (late: reordered within a batch, stale across batches). The backlog is cut into
batches of `--batch` entries in judging order and settled once in order, each batch against
its jobs' records as the batches before left them; what is timed is `settle` on those same
inputs again, every batch of the backlog per round. It prints the process CPU per event (µs,
the median of `--rounds`; CPU time, not wall time, so that other work on a busy machine counts
less), the verdicts of the backlog, and with `--profile` cProfile's own time per function (it
adds its own overhead to every call: read the shares, not the sum). Compare two commits by
running it with each one's `src/` first on PYTHONPATH, alternating the two.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import sys
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eco_router.adapters.json_codec import OrjsonEventEncoder
from eco_router.application.port_values import EncodedEvent
from eco_router.domain.event import FIRST_TOKEN_SEQ, JobEvent
from eco_router.domain.settle import JobKey, Limits, StoredJob, settle
from eco_router.domain.text import DEFAULT_TEXT_MAX_BYTES
from eco_router.domain.verdict import in_judging_order

# The worker's defaults: READ_COUNT 100 per read, HISTORY_SIZE 100, 1 MiB of history.
LIMITS = Limits(history_size=100, history_max_bytes=1 << 20, text_max_bytes=DEFAULT_TEXT_MAX_BYTES)
ENTRY_MS = 1_700_000_000_000
WORDS = ("The", " scan", " found", " 3", " open", " ports", ";", " é", " café", "\n", " ok")


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch as `settle` gets it: its entries in judging order and their jobs' records."""

    items: list[EncodedEvent]
    records: dict[JobKey, StoredJob]


class Backlog:
    """Entries of `jobs` concurrent jobs in stream order, retries, redeliveries and late ones."""

    def __init__(self, rng: random.Random, chat_every: int) -> None:
        self.rng = rng
        self.chat_every = chat_every
        self.encoder = OrjsonEventEncoder()
        self.entries: list[EncodedEvent] = []
        self.held: list[tuple[int, EncodedEvent]] = []
        self.started = 0
        self.ids = 0

    def job(self) -> list[dict[str, Any]]:
        """One job's events, in the order its producer writes them."""
        self.started += 1
        job_id = f"job-{self.started}"
        if self.chat_every and self.started % self.chat_every == 0:
            return self._chat(job_id)
        return self._scan(job_id)

    def _scan(self, job_id: str) -> list[dict[str, Any]]:
        fields: dict[str, Any] = {"domain": "scan", "job_id": job_id}
        events = [fields | {"seq": 1, "stage": "queued", "status": "queued"}]
        for seq in range(2, 2 + self.rng.randint(3, 8)):
            progress = min(99, seq * 10)
            events.append(fields | {"seq": seq, "stage": "scanning", "progress": progress})
        last = events[-1]["seq"]
        events.append(fields | {"seq": last + 1, "stage": "writing", "progress": 99})
        if self.rng.random() < 0.05:
            events.append(fields | {"seq": 1, "stage": "cancel_requested"})
        result = {"hosts": self.rng.randint(1, 50), "ports": [22, 80, 443], "ok": True}
        events.append(
            fields | {"seq": last + 2, "stage": "done", "status": "done", "result": result}
        )
        return events

    def _chat(self, job_id: str) -> list[dict[str, Any]]:
        fields: dict[str, Any] = {"domain": "chat", "job_id": job_id}
        events = [
            fields | {"seq": 1, "stage": "queued", "status": "queued"},
            fields | {"seq": 2, "stage": "running", "status": "running"},
        ]
        nodes = ("answer",) if self.rng.random() < 0.7 else ("plan", "answer")
        tokens = self.rng.randint(20, 120)
        for n in range(tokens):
            extra = {"content": self.rng.choice(WORDS), "node": nodes[n * len(nodes) // tokens]}
            events.append(
                fields
                | {"seq": FIRST_TOKEN_SEQ + n, "stage": "token", "status": "running"}
                | {"extra": extra}
            )
        events.append(fields | {"seq": 3, "stage": "done", "status": "done", "result": "ok"})
        return events

    def write(self, fields: dict[str, Any]) -> None:
        """Add one entry (or hold it back); a retry or a redelivery now and then."""
        stream = f"{fields['domain']}:events:{zlib.crc32(fields['job_id'].encode()) % 4}"
        event = JobEvent(stream=stream, stream_id=self._entry_id(), **fields)
        item = EncodedEvent(event, self.encoder.encode(event))
        draw = self.rng.random()
        if draw < 0.03:
            self.held.append((self.rng.randint(1, 3), item))
            return
        self._add(item)
        if draw < 0.055:
            retry = JobEvent(**{**_fields(event), "stream_id": self._entry_id()})
            self._add(EncodedEvent(retry, self.encoder.encode(retry)))
        elif draw < 0.08:
            self._add(item)

    def _entry_id(self) -> str:
        self.ids += 1
        return f"{ENTRY_MS + self.ids // 10}-{self.ids % 10}"

    def _add(self, item: EncodedEvent) -> None:
        self.entries.append(item)
        still = []
        for wait, late in self.held:
            if late.event.job_key == item.event.job_key and wait <= 1:
                self.entries.append(late)
            else:
                still.append((wait - 1 if late.event.job_key == item.event.job_key else wait, late))
        self.held = still

    def fill(self, events: int, jobs: int) -> list[EncodedEvent]:
        running = [iter(self.job()) for _ in range(jobs)]
        while len(self.entries) < events:
            n = self.rng.randrange(jobs)
            fields = next(running[n], None)
            if fields is None:
                running[n] = iter(self.job())
                continue
            self.write(fields)
        return self.entries[:events]


def _fields(event: JobEvent) -> dict[str, Any]:
    return event._asdict()


def batches(entries: list[EncodedEvent], size: int) -> tuple[list[Batch], Counter[str]]:
    """The backlog cut into batches in judging order, each with the records it is settled
    against (as the batches before it left them), and the verdicts of the whole run."""
    records: dict[JobKey, StoredJob] = {}
    prepared = []
    verdicts: Counter[str] = Counter()
    for start in range(0, len(entries), size):
        chunk = entries[start : start + size]
        by_event = {id(item.event): item for item in chunk}
        items = [by_event[id(event)] for event in in_judging_order(e.event for e in chunk)]
        own = {
            item.event.job_key: records[item.event.job_key]
            for item in items
            if item.event.job_key in records
        }
        prepared.append(Batch(items, own))
        settled = settle(items, own, LIMITS)
        verdicts.update(judgement.verdict.value for judgement in settled.judgements)
        for write in settled.writes:
            records[write.job] = write.record
    return prepared, verdicts


def measure(prepared: list[Batch], rounds: int, profile: bool) -> list[float]:
    events = sum(len(batch.items) for batch in prepared)
    profiler = cProfile.Profile() if profile else None
    figures = []
    for _ in range(rounds):
        if profiler is not None:
            profiler.enable()
        started = time.process_time()
        for batch in prepared:
            settle(batch.items, batch.records, LIMITS)
        elapsed = time.process_time() - started
        if profiler is not None:
            profiler.disable()
        figures.append(1e6 * elapsed / events)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return figures


def parse_args(argv: Sequence[str] | None) -> Any:
    parser = argparse.ArgumentParser(prog="python -m bench.settle_profile")
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chat-every", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    entries = Backlog(random.Random(args.seed), args.chat_every).fill(args.events, args.jobs)
    prepared, verdicts = batches(entries, args.batch)
    figures = measure(prepared, args.rounds, args.profile)
    tokens = sum(item.event.is_token for item in entries)
    print(
        f"{len(entries):,} events ({tokens:,} tokens) of {args.jobs} jobs at a time in batches "
        f"of {args.batch}: settle {statistics.median(figures):.2f} us per event "
        f"(rounds {', '.join(f'{f:.2f}' for f in figures)})"
    )
    print("verdicts: " + ", ".join(f"{v} {n:,}" for v, n in verdicts.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
