"""Where the gateway's CPU per delivered frame goes, with no socket and no Redis.

Run from the repository root: `.venv/bin/python -m bench.fanout_profile [--viewers 5000]
[--events 200] [--profile]`.

One job, `--viewers` streams of `StreamJobEvents` each with a `TransportFrameWriter` on a
transport that keeps nothing (the `write()` system call is not measured), all fed by the
Pub/Sub adapter's `ChannelViewers` as its reader task does: each event is one message handed
to `deliver`, then the loop's turn ends and the batch of writes is flushed. It prints the
process CPU per delivered frame (µs, the median of `--rounds`; CPU time, not wall time, so
that other work on a busy machine counts less), and with `--profile` where it goes
(cProfile's own time per function, which adds its own overhead to every call: read the shares,
not the sum). Compare two commits by running it with each one's `src/` first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import orjson
import uvloop
from prometheus_client import CollectorRegistry

from eco_router.adapters.json_codec import OrjsonEventDecoder
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.adapters.prometheus.gateway_metrics import PrometheusGatewayMetrics
from eco_router.adapters.redis.gateway.channel_viewers import ChannelViewers
from eco_router.adapters.system_clock import SystemClock
from eco_router.application.stream_job_events import StreamJobEvents
from eco_router.entrypoints.http.frame_writer import ConnectionWrites, TransportFrameWriter
from eco_router.testing.confirmed_feed import ConfirmedFeed

DOMAIN = "scan"
JOB = "fan"
CHANNEL = f"events:{JOB}"


class _Cycle:
    response_started = True
    response_complete = False
    disconnected = False


class _Flow:
    write_paused = False


class _Transport:
    """Counts the bytes written; keeps none."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += 1

    def is_closing(self) -> bool:
        return False


def payload(event_id: int) -> bytes:
    return orjson.dumps(
        {
            "event_id": event_id,
            "prev_event_id": event_id - 1 if event_id > 1 else None,
            "job_id": JOB,
            "domain": DOMAIN,
            "stage": "scan",
            "status": "running",
            "progress": event_id,
            "stream_id": f"{time.time_ns() // 1_000_000}-0",
        }
    )


async def measure(viewers: int, events: int, rounds: int, profile: bool) -> list[float]:
    clock = SystemClock()
    decoder = OrjsonEventDecoder()
    metrics = PrometheusGatewayMetrics(CollectorRegistry())
    feed = ConfirmedFeed(ChannelViewers(decoder=decoder, metrics=metrics, queue_size=256))
    store = InMemoryStateStore(
        clock=clock,
        streams=InMemoryStreams(clock),
        group="routers",
        state_ttl_s=3600,
        markers_ttl_s=3600,
        history_size=100,
    )
    use_case = StreamJobEvents(
        feed=feed, store=store, decoder=decoder, clock=clock, metrics=metrics
    )
    writes = ConnectionWrites()
    transports = []
    tasks = []
    for _ in range(viewers):
        stream = await use_case.open(DOMAIN, JOB)
        transport = _Transport()
        writer = TransportFrameWriter(_Cycle(), transport, _Flow(), writes)
        transports.append(transport)
        tasks.append(asyncio.create_task(stream.run(writer)))
    for _ in range(3):
        await asyncio.sleep(0)
    figures = []
    next_id = 1
    profiler = cProfile.Profile() if profile else None
    for _ in range(rounds):
        messages = [payload(next_id + n) for n in range(events)]
        next_id += events
        before = sum(t.written for t in transports)
        if profiler is not None:
            profiler.enable()
        started = time.process_time()
        for message in messages:
            feed.viewers.deliver(CHANNEL, message)
            # The end of the reader's turn: the batch of writes goes out.
            await asyncio.sleep(0)
        elapsed = time.process_time() - started
        if profiler is not None:
            profiler.disable()
        frames = sum(t.written for t in transports) - before
        if frames != viewers * events:
            raise SystemExit(f"{frames:,} frames written, {viewers * events:,} expected")
        figures.append(1e6 * elapsed / frames)
    feed.close_viewers()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(18)
    return figures


def parse_args(argv: Sequence[str] | None) -> Any:
    parser = argparse.ArgumentParser(prog="python -m bench.fanout_profile")
    parser.add_argument("--viewers", type=int, default=5_000)
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    figures = uvloop.run(measure(args.viewers, args.events, args.rounds, args.profile))
    print(
        f"{args.viewers:,} viewers x {args.events} events x {args.rounds} rounds: "
        f"Python CPU per delivered frame {statistics.median(figures):.2f} us "
        f"(rounds {', '.join(f'{f:.2f}' for f in figures)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
