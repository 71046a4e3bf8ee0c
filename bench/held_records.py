"""The router's memory per job record its Redis state store holds.

    .venv/bin/python -m bench.held_records [--events 20000] [--jobs 2000] [--read-count 100]

The router benchmark's backlog (`bench/backlog.py`) is written to a throwaway `redis-server`
and applied batch by batch, as `bench/apply_script.py` does, twice in one process (each time
on a fresh server): by a store that holds no record, then by one that holds them all. The
memory still allocated after each (tracemalloc, after a collection) differs by what the held
records take; divided by the jobs held, it is the memory per held record. The first run
fills the caches both share.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tracemalloc
from typing import Any

import redis
import redis.asyncio

from bench.apply_script import backlog_store, read_batches
from bench.backlog import FAMILY, make_workload
from eco_router.testing import RedisServer


async def _retained(port: int, batches: list[Any], held_jobs: int) -> tuple[int, int, int]:
    """Bytes still allocated after applying `batches` with a store holding up to
    `held_jobs` records, the records held, and their markers."""
    client = redis.asyncio.Redis(port=port)
    fence = dict.fromkeys(FAMILY.streams, 0)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    store = backlog_store(client, held_jobs=held_jobs)
    for batch in batches:
        await store.apply(batch, fence)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    held = store.held_jobs
    markers = sum(len(h.record.markers) for h in store._held.values())
    await client.aclose()
    return after - before, held, markers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--read-count", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    workload = make_workload(args.events, args.jobs, args.seed)
    tracemalloc.start()
    runs = []
    for held_jobs in (0, args.jobs * 2):
        with RedisServer() as server:
            sync = redis.Redis(port=server.port)
            pipe = sync.pipeline(transaction=False)
            for stream, fields in workload.entries:
                pipe.xadd(stream, fields)  # type: ignore[arg-type]
            pipe.execute()
            batches = read_batches(sync, args.read_count)
            sync.close()
            runs.append(asyncio.run(_retained(server.port, batches, held_jobs)))
            del batches
    tracemalloc.stop()
    (none, _, _), (every, held, markers) = runs
    per = (every - none) / held
    print(f"{held} records held ({markers / held:.1f} markers each): {per:,.0f} bytes per record")


if __name__ == "__main__":
    main()
