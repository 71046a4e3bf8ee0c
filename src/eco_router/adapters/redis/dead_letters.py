"""Redis stream adapter of `DeadLetterSink`."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from eco_router.adapters.dead_letter_format import dead_letter_fields
from eco_router.adapters.redis.errors import transient_errors
from eco_router.application.messages import DeadLetter
from eco_router.application.ports import DeadLetterSink


class RedisStreamDeadLetterSink(DeadLetterSink):
    """XADDs each letter to its family's `{prefix}:dlq` stream, trimmed approximately."""

    def __init__(self, redis: Redis, *, maxlen: int = 100_000) -> None:
        self._redis = redis
        self._maxlen = maxlen

    async def send(self, letters: Sequence[DeadLetter]) -> None:
        if not letters:
            return
        with transient_errors("XADD dead letters"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for letter in letters:
                    pipe.xadd(
                        letter.delivery.family.dead_letter_stream,
                        dead_letter_fields(letter),  # type: ignore[arg-type]
                        maxlen=self._maxlen,
                        approximate=True,
                    )
                await pipe.execute()
