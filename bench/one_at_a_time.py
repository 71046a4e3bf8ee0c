"""A naive one-event-at-a-time router: the baseline the router benchmark compares the worker with.

Run from the repository root:

    .venv/bin/python -m bench.one_at_a_time --streams-url redis://127.0.0.1:6379/0 \\
        --pubsub-url redis://127.0.0.1:6380/0 [--group eventrouter --consumer naive]

It routes the same entries to the same keys and channels as `eco-router worker`, written the
way a router is written when nobody batches. While there is work, each event costs exactly
four commands, each its own round trip:

1. XREADGROUP COUNT 1 on one shard stream (round-robin over `scan:events:0..3`);
2. EVALSHA of a per-event script with the router's semantics for one event (judge
   NEW / republish / DUPLICATE / STALE; apply a NEW one: state, history, applied-markers);
3. PUBLISH on `sse:events:{job_id}` (Pub/Sub server) of the same JSON payload as the worker's,
   when the event is NEW;
4. XACK.

One concession keeps the comparison about batching rather than about idle waits: reads carry
no BLOCK while the last round over the shards found anything, so a shard that ran dry does not
stall the others; once a whole round comes back empty, each read blocks for `--block-ms`.

Entries that cannot be parsed are acked and counted as invalid (no dead-letter stream). There
is no pending-entry recovery. SIGTERM or SIGINT stops it after the event in flight is acked;
it then prints one line, `summary {json}`, with its verdict and read counts.
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

# The router's rules for a single event, in Lua: the same keys, markers and writes as its store.
# KEYS: state, history, applied-markers hash (seq -> id of the entry that applied it; "last").
# ARGV: state_ttl_s, markers_ttl_s, history_size, seq, entry id, payload.
# Returns "0" new and applied, "1" new but applied earlier by this same entry (publish
# again), "2" duplicate, "3" stale.
APPLY_ONE_LUA = """
local seq = ARGV[4]
local entry_id = ARGV[5]
local known = redis.call('HMGET', KEYS[3], 'last', seq)
local by = known[2]
if by == entry_id then
  return '1'
elseif by then
  return '2'
elseif tonumber(seq) <= tonumber(known[1] or '-1') then
  return '3'
end
redis.call('SET', KEYS[1], ARGV[6], 'EX', ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[6])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[3]), -1)
redis.call('EXPIRE', KEYS[2], ARGV[1])
-- `last` stays the seq's own string: Lua would print a large number in exponent form.
redis.call('HSET', KEYS[3], seq, entry_id, 'last', seq)
redis.call('EXPIRE', KEYS[3], ARGV[2])
return '0'
"""

VERDICTS = {b"0": "new", b"1": "new", b"2": "duplicate", b"3": "stale"}
# Fields the payload carries typed or under their own name; the rest are copied as strings.


class NaiveRouter:
    """Reads, judges, applies, publishes and acks one entry at a time, with plain redis-py."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.streams = redis.Redis.from_url(args.streams_url)
        self.pubsub = redis.Redis.from_url(args.pubsub_url)
        self.group: str = args.group
        self.consumer: str = args.consumer
        self.shards = [f"{args.prefix}:{n}" for n in range(args.shards)]
        self.domain: str = args.prefix.split(":", 1)[0]
        self.channel_prefix: str = args.channel_prefix
        self.block_ms: int = args.block_ms
        self.head = [args.state_ttl, args.markers_ttl, args.history_size]
        self.apply_one = self.streams.register_script(APPLY_ONE_LUA)
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
        shard = 0
        empty_in_a_row = 0
        while not self.stopping:
            stream = self.shards[shard]
            shard = (shard + 1) % len(self.shards)
            idle = empty_in_a_row >= len(self.shards)
            reply: Any = self.streams.xreadgroup(
                self.group,
                self.consumer,
                {stream: ">"},
                count=1,
                block=self.block_ms if idle else None,
            )
            self.counts["reads"] += 1
            if not reply or not reply[0][1]:
                self.counts["empty"] += 1
                empty_in_a_row += 1
                continue
            empty_in_a_row = 0
            entry_id, fields = reply[0][1][0]
            self.route(stream, entry_id.decode(), fields)

    def route(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """Judge and apply, publish if NEW, then ack: one entry, four commands."""
        event = self.payload(entry_id, fields)
        if event is None:
            self.counts["invalid"] += 1
        else:
            job_id, seq, payload = event
            keys = [
                f"{self.domain}:state:{job_id}",
                f"{self.domain}:history:{job_id}",
                f"{self.domain}:applied:{job_id}",
            ]
            code = self.apply_one(keys=keys, args=[*self.head, seq, entry_id, payload])
            self.counts[VERDICTS[code]] += 1
            if code in (b"0", b"1"):
                self.pubsub.publish(f"{self.channel_prefix}:{job_id}", payload)
        self.streams.xack(stream, self.group, entry_id)

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
        prog="python -m bench.one_at_a_time", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--streams-url", required=True)
    parser.add_argument("--pubsub-url", required=True)
    parser.add_argument("--group", default="eventrouter")
    parser.add_argument("--consumer", default="naive")
    parser.add_argument("--prefix", default="scan:events", help="stream family")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--channel-prefix", default="sse:events")
    parser.add_argument(
        "--block-ms", type=int, default=5, help="BLOCK of a read once a round found nothing"
    )
    # The worker's defaults (EVENT_ROUTER_STATE_TTL_S, _PUBLISHED_TTL_S, _HISTORY_SIZE).
    parser.add_argument("--state-ttl", type=int, default=3600)
    parser.add_argument("--markers-ttl", type=int, default=7200)
    parser.add_argument("--history-size", type=int, default=100)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    router = NaiveRouter(parse_args(argv))
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
