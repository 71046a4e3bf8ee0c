"""A plain batch router: the yardstick the router benchmark holds the worker's per-batch cost to.

Run from the repository root:

    .venv/bin/python -m bench.plain_batch --streams-url redis://127.0.0.1:6379/0 \\
        --pubsub-url redis://127.0.0.1:6380/0 [--group eventrouter --consumer plain]

It routes the same entries to the same channels as `eco-router worker`, written the way a
batch router is written when it does the least that batching needs, with synchronous redis-py.
Per batch:

1. one XREADGROUP COUNT `--count` (100) over the four shard streams, with BLOCK `--block-ms`;
2. one EVALSHA applying the whole batch: per job a state key (the newest NEW payload) and a
   dedupe marker hash (seq -> id of the entry that applied it, plus `last`); the same
   new / republish / duplicate / stale verdicts as the router's, but no history, no
   fencing token, no history byte count;
3. one pipeline of PUBLISH on `sse:events:{job_id}` (Pub/Sub server), one per NEW event, of
   the same JSON payload as the worker's;
4. one XACK per shard read, each carrying every id of its shard, pipelined together.

No order check, no leases, no heartbeat, no pending-entry recovery, no dead-letter stream
(unparseable entries are acked and counted as invalid), no metrics. SIGTERM or SIGINT stops it
after the batch in flight is acked; it then prints one line, `summary {json}`, with its verdict
and read counts (same shape as `bench.one_at_a_time`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from types import FrameType
from typing import Any

import orjson
import redis
from redis.exceptions import ResponseError

from bench.baseline_payload import routed_payload

# KEYS: per job two keys: state, applied-markers hash.
# ARGV: state_ttl_s, markers_ttl_s, then per event: job index (1-based), seq, entry id, payload;
# a job's events in seq order.
# Returns one character per event: "0" new, "1" republish, "2" duplicate, "3" stale.
APPLY_BATCH_LUA = """
local codes = {}
local last_of = {}
for i = 3, #ARGV, 4 do
  local job = tonumber(ARGV[i])
  local state, markers = KEYS[job * 2 - 1], KEYS[job * 2]
  local seq, entry_id = ARGV[i + 1], ARGV[i + 2]
  local known = redis.call('HMGET', markers, 'last', seq)
  local by = known[2]
  local code
  if by == entry_id then
    code = '1'
  elseif by then
    code = '2'
  elseif tonumber(seq) <= tonumber(known[1] or '-1') then
    code = '3'
  else
    code = '0'
    redis.call('SET', state, ARGV[i + 3], 'EX', ARGV[1])
    redis.call('HSET', markers, seq, entry_id, 'last', seq)
    redis.call('EXPIRE', markers, ARGV[2])
  end
  codes[#codes + 1] = code
end
return table.concat(codes)
"""

VERDICTS = {"0": "new", "1": "new", "2": "duplicate", "3": "stale"}


class PlainBatchRouter:
    """Reads a batch over every shard, applies it in one script call, publishes, acks."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.streams = redis.Redis.from_url(args.streams_url)
        self.pubsub = redis.Redis.from_url(args.pubsub_url)
        self.group: str = args.group
        self.consumer: str = args.consumer
        self.shards = [f"{args.prefix}:{n}" for n in range(args.shards)]
        self.domain: str = args.prefix.split(":", 1)[0]
        self.channel_prefix: str = args.channel_prefix
        self.block_ms: int = args.block_ms
        self.count: int = args.count
        self.head = [args.state_ttl, args.markers_ttl]
        self.apply = self.streams.register_script(APPLY_BATCH_LUA)
        self.counts: Counter[str] = Counter()
        self.stopping = False

    def prepare(self) -> None:
        """Create the group on every shard like the worker does: from 0, MKSTREAM."""
        self.streams.ping()
        self.pubsub.ping()
        for stream in self.shards:
            try:
                self.streams.xgroup_create(stream, self.group, id="0", mkstream=True)
            except ResponseError as error:
                if "BUSYGROUP" not in str(error):
                    raise

    def run(self) -> None:
        streams: dict[Any, Any] = dict.fromkeys(self.shards, ">")
        while not self.stopping:
            reply: Any = self.streams.xreadgroup(
                self.group, self.consumer, streams, count=self.count, block=self.block_ms
            )
            self.counts["reads"] += 1
            entries = [
                (stream.decode(), entry_id.decode(), fields)
                for stream, found in reply or ()
                for entry_id, fields in found
            ]
            if not entries:
                self.counts["empty"] += 1
                continue
            self.route(entries)

    def route(self, entries: Sequence[tuple[str, str, dict[bytes, bytes]]]) -> None:
        """Judge and apply the batch in one call, publish the NEW ones, ack every entry."""
        jobs: dict[str, int] = {}
        events: list[tuple[str, int, str, bytes]] = []
        for _, entry_id, fields in entries:
            event = self.payload(entry_id, fields)
            if event is None:
                self.counts["invalid"] += 1
            else:
                events.append((event[0], event[1], entry_id, event[2]))
        # A job's events in seq order, as the apply script judges them.
        events.sort(key=lambda e: (e[0], e[1]))
        keys: list[str] = []
        args: list[str | int | bytes] = [*self.head]
        for job_id, seq, entry_id, payload in events:
            index = jobs.get(job_id)
            if index is None:
                index = jobs[job_id] = len(jobs) + 1
                keys += (f"{self.domain}:state:{job_id}", f"{self.domain}:applied:{job_id}")
            args += (index, seq, entry_id, payload)
        if events:
            codes = self.apply(keys=keys, args=args).decode()
            pipe = self.pubsub.pipeline(transaction=False)
            for (job_id, _, _, payload), code in zip(events, codes, strict=True):
                self.counts[VERDICTS[code]] += 1
                if code in "01":
                    pipe.publish(f"{self.channel_prefix}:{job_id}", payload)
            pipe.execute()
        ids: dict[str, list[str]] = {}
        for stream, entry_id, _ in entries:
            ids.setdefault(stream, []).append(entry_id)
        pipe = self.streams.pipeline(transaction=False)
        for stream, entry_ids in ids.items():
            pipe.xack(stream, self.group, *entry_ids)
        pipe.execute()

    def payload(self, entry_id: str, fields: dict[bytes, bytes]) -> tuple[str, int, bytes] | None:
        """(job_id, seq, JSON payload) shaped like the worker's, or None if it cannot parse."""
        return routed_payload(entry_id, fields, self.domain)

    def stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def close(self) -> None:
        self.streams.close()
        self.pubsub.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.plain_batch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--streams-url", required=True)
    parser.add_argument("--pubsub-url", required=True)
    parser.add_argument("--group", default="eventrouter")
    parser.add_argument("--consumer", default="plain")
    parser.add_argument("--prefix", default="scan:events", help="stream family")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--channel-prefix", default="sse:events")
    parser.add_argument("--count", type=int, default=100, help="XREADGROUP COUNT")
    # Short, so a stop request is noticed soon; an append wakes the read at once anyway.
    parser.add_argument("--block-ms", type=int, default=100, help="XREADGROUP BLOCK")
    parser.add_argument("--state-ttl", type=int, default=3600)
    parser.add_argument("--markers-ttl", type=int, default=7200)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    router = PlainBatchRouter(parse_args(argv))
    signal.signal(signal.SIGTERM, router.stop)
    signal.signal(signal.SIGINT, router.stop)
    try:
        router.prepare()
        router.run()
    finally:
        router.close()
        print("summary " + orjson.dumps(router.counts).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
