"""Redis Pub/Sub adapter of `Broadcaster`."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from eco_router.adapters.redis.errors import transient_errors
from eco_router.application.errors import PublishFailed, TransientError
from eco_router.application.messages import EncodedEvent
from eco_router.application.ports import Broadcaster


class RedisPubSubBroadcaster(Broadcaster):
    """Publishes each payload on `{channel_prefix}:{job_id}`, the batch in one pipeline."""

    def __init__(self, redis: Redis, *, channel_prefix: str) -> None:
        self._redis = redis
        self._prefix = channel_prefix

    def channel(self, job_id: str) -> str:
        return f"{self._prefix}:{job_id}"

    async def publish(self, events: Sequence[EncodedEvent]) -> None:
        if not events:
            return
        with transient_errors(f"PUBLISH {len(events)} events", PublishFailed):
            async with self._redis.pipeline(transaction=False) as pipe:
                for item in events:
                    pipe.publish(self.channel(item.event.job_id), item.payload)
                await pipe.execute()

    async def ping(self) -> None:
        with transient_errors("PING Pub/Sub server", TransientError):
            await self._redis.ping()
