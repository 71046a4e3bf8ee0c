"""Sharded stream families: names, domains and the shard rule shared with producers."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from eco_router.domain.errors import InvalidStreamName


@dataclass(frozen=True, slots=True)
class StreamFamily:
    """The shards of one stream prefix, e.g. `scan:events` with 4 shards."""

    prefix: str
    shards: int

    @property
    def domain(self) -> str:
        """The first segment of the prefix: `scan` for `scan:events`."""
        return self.prefix.split(":", 1)[0]

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(f"{self.prefix}:{shard}" for shard in range(self.shards))

    @property
    def dead_letter_stream(self) -> str:
        return f"{self.prefix}:dlq"

    def stream_for(self, job_id: str) -> str:
        return f"{self.prefix}:{shard_for(job_id, self.shards)}"


def shard_for(job_id: str, shards: int) -> int:
    """First 8 bytes of md5(job_id), big-endian, modulo the shard count: stable across processes."""
    digest = hashlib.md5(job_id.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big") % shards


def shard_of(stream: str) -> int:
    """The shard number at the end of a stream name."""
    _, _, tail = stream.rpartition(":")
    if not (tail.isascii() and tail.isdigit()):
        raise InvalidStreamName(f"stream {stream!r} does not end in a shard number")
    return int(tail)
