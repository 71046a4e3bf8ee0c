"""Sharded stream families: names, domains and the shard rule shared with producers."""

from __future__ import annotations

import binascii
import functools
import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from eco_router.domain.errors import InvalidStreamName

# Redis Cluster's hash slots; a key's slot is CRC16 (XMODEM, `binascii.crc_hqx`) of its hash
# tag (the text inside its first `{...}`), or of the whole key when it has none.
SLOTS = 16384


@dataclass(frozen=True, slots=True)
class StreamFamily:
    """The shards of one stream prefix, e.g. `scan:events` with 4 shards.

    `tagged` names each shard with a hash tag (`scan:events:{5461}:1`) chosen so the shards
    spread evenly over a Redis Cluster's slots; each shard's jobs carry the same tag, so every
    key a batch of the shard touches lives in one slot.
    """

    prefix: str
    shards: int
    tagged: bool = False

    @property
    def domain(self) -> str:
        """The first segment of the prefix: `scan` for `scan:events`."""
        return self.prefix.split(":", 1)[0]

    @property
    def streams(self) -> tuple[str, ...]:
        return _stream_names(self.prefix, self.shards, self.tagged)

    @property
    def dead_letter_stream(self) -> str:
        return f"{self.prefix}:dlq"

    def stream_for(self, job_id: str) -> str:
        return self.streams[shard_for(job_id, self.shards)]


def families_by_stream(families: Iterable[StreamFamily]) -> dict[str, StreamFamily]:
    """Each shard stream of `families` with its family, in the families' and shards' order."""
    return {stream: family for family in families for stream in family.streams}


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


def key_slot(key: str) -> int:
    """The Redis Cluster hash slot of `key`, its hash tag honoured."""
    data = key.encode()
    start = data.find(b"{")
    if start != -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return binascii.crc_hqx(data, 0) % SLOTS


def slot_named(name: str) -> str:
    """`name` as the hash tag of keys that must share its slot: a tagged stream's own name
    (its tag comes first), anything else in braces."""
    return name if "{" in name else f"{{{name}}}"


def hash_tag(name: str) -> str | None:
    """The text inside `name`'s first `{...}`, if it has a non-empty one."""
    start = name.find("{")
    end = name.find("}", start + 1) if start != -1 else -1
    return name[start + 1 : end] if end > start + 1 else None


@functools.cache
def _stream_names(prefix: str, shards: int, tagged: bool) -> tuple[str, ...]:
    if not tagged:
        return tuple(f"{prefix}:{shard}" for shard in range(shards))
    # A per-prefix phase, so two families with the same shard count do not stack their
    # shards on the same slots (and nodes).
    phase = int.from_bytes(hashlib.md5(prefix.encode(), usedforsecurity=False).digest()[:4])
    offset = phase / 2**32
    return tuple(
        f"{prefix}:{{{_tag_of_slot()[int((shard + offset) * SLOTS / shards) % SLOTS]}}}:{shard}"
        for shard in range(shards)
    )


@functools.cache
def _tag_of_slot() -> tuple[str, ...]:
    """For every slot, the smallest number whose text hashes to it: the hash tags that place
    a shard exactly (computed once, ~0.2 s)."""
    tags: list[str | None] = [None] * SLOTS
    missing = SLOTS
    for number in itertools.count():
        text = str(number)
        slot = binascii.crc_hqx(text.encode(), 0) % SLOTS
        if tags[slot] is None:
            tags[slot] = text
            missing -= 1
            if not missing:
                break
    return tuple(t for t in tags if t is not None)
