"""Redis stream adapter of `DeadLetterSink`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from eco_router.adapters.dead_letter_format import (
    StoredDeadLetter,
    dead_letter_fields,
    read_dead_letter,
)
from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.errors import redis_errors
from eco_router.adapters.redis.keys import DeadLetterKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.port_values import DeadLetter, DeadLetterTally, Replayed
from eco_router.application.ports import DeadLetterArchive, DeadLetterSink
from eco_router.domain.streams import StreamFamily

_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


class MissingDeadLetters(LookupError):
    """Some ids name no dead letter; `missing` says, per id, what is wrong with it."""

    def __init__(self, missing: Sequence[str]) -> None:
        super().__init__("; ".join(missing))
        self.missing = list(missing)


class RedisStreamDeadLetterSink(DeadLetterSink):
    """XADDs each letter to its family's `{prefix}:dlq` stream, trimmed approximately, once
    per entry: a marker (`DeadLetterKeys`) kept for `marker_ttl_s` is set in the same script
    call, and a letter whose entry has one is not appended again."""

    def __init__(
        self, redis: RedisClient, *, maxlen: int = 100_000, marker_ttl_s: int = 7200
    ) -> None:
        self._redis = redis
        self._maxlen = maxlen
        self._marker_ttl_ms = marker_ttl_s * 1000
        self._script = redis.register_script(load_lua("dead_letter_once.lua"))

    async def send(self, letters: Sequence[DeadLetter]) -> None:
        # One call per dead-letter stream: its markers share its cluster slot.
        by_stream: dict[str, list[DeadLetter]] = {}
        for letter in letters:
            by_stream.setdefault(letter.delivery.family.dead_letter_stream, []).append(letter)
        for stream, group in by_stream.items():
            keys = DeadLetterKeys(stream)
            args: list[int | bytes] = [self._maxlen, self._marker_ttl_ms]
            for letter in group:
                fields = dead_letter_fields(letter)
                args.append(2 * len(fields))
                for name, value in fields.items():
                    args += (name, value)
            markers = [keys.marker(x.delivery.stream, x.delivery.entry_id) for x in group]
            with redis_errors("XADD dead letters", key=stream):
                await self._script(keys=[stream, *markers], args=args)


class RedisDeadLetterArchive(DeadLetterArchive):
    """Reads dead letters back and replays them onto their original stream after a fix."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def oldest(self, family: StreamFamily, *, count: int = 100) -> list[StoredDeadLetter]:
        """The oldest `count` dead letters of the family."""
        with redis_errors("XRANGE dead letters"):
            entries = await self._redis.xrange(family.dead_letter_stream, count=count)
        return _letters(entries)

    async def replay(self, family: StreamFamily, dlq_ids: Sequence[str] | None) -> list[Replayed]:
        """Put the letters (all when `dlq_ids` is None) back on their stream, then delete them.

        The original fields go back byte for byte under a new entry id; a replay interrupted
        between the two steps may append twice, which the router's dedup absorbs. When an id
        names no dead letter, nothing is replayed: `MissingDeadLetters` lists every such id.
        """
        letters = await self._select(family, dlq_ids)
        replayed = []
        for letter in letters:
            if letter.stream not in family.streams:
                raise ValueError(
                    f"dead letter {letter.dlq_id} names stream {letter.stream!r}, "
                    f"which is not a shard of {family.prefix}"
                )
            with redis_errors("replay dead letter"):
                new_id = await self._redis.xadd(letter.stream, dict(letter.fields))  # type: ignore[arg-type]
                await self._redis.xdel(family.dead_letter_stream, letter.dlq_id)
            replayed.append(Replayed(letter.dlq_id, letter.stream, _text(new_id)))
        return replayed

    async def tally(self, family: StreamFamily) -> DeadLetterTally:
        with redis_errors("XLEN dead letters"):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xlen(family.dead_letter_stream)
                pipe.xrevrange(family.dead_letter_stream, count=1)
                length, newest = await pipe.execute()
        return DeadLetterTally(int(length), _text(newest[0][0]) if newest else None)

    async def _select(
        self, family: StreamFamily, dlq_ids: Sequence[str] | None
    ) -> list[StoredDeadLetter]:
        if dlq_ids is None:
            with redis_errors("XRANGE dead letters"):
                entries = await self._redis.xrange(family.dead_letter_stream)
            return _letters(entries)
        wanted = list(dict.fromkeys(dlq_ids))
        # A bare millisecond time would be read as a range: every letter of that millisecond.
        malformed = [i for i in wanted if _ENTRY_ID.fullmatch(i) is None]
        well_formed = [i for i in wanted if i not in malformed]
        async with self._redis.pipeline(transaction=False) as pipe:
            for dlq_id in well_formed:
                pipe.xrange(family.dead_letter_stream, dlq_id, dlq_id)
            with redis_errors("XRANGE dead letters"):
                found = await pipe.execute() if well_formed else []
        letters = [_letters(entries) for entries in found]
        missing = [
            f"{dlq_id!r} is not a dead-letter id (MILLISECONDS-SEQUENCE, as `dlq list` shows)"
            for dlq_id in malformed
        ]
        missing += [
            f"no dead letter {dlq_id} in {family.dead_letter_stream}"
            for dlq_id, letter in zip(well_formed, letters, strict=True)
            if not letter
        ]
        if missing:
            raise MissingDeadLetters(missing)
        return [letter for each in letters for letter in each]


def _letters(entries: Any) -> list[StoredDeadLetter]:
    return [read_dead_letter(_text(i), fields) for i, fields in entries or ()]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
