"""Lua-backed Redis adapter of `StateStore`."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from eco_router.adapters.redis.errors import transient_errors
from eco_router.adapters.redis.keys import JobKeys
from eco_router.adapters.redis.scripts import load_lua
from eco_router.application.messages import EncodedEvent, JobView
from eco_router.application.ports import StateStore
from eco_router.domain.verdict import DUPLICATE, NEW_APPLY, NEW_REPUBLISH, STALE, Judgement

_JUDGEMENTS = {ord("0"): NEW_APPLY, ord("1"): NEW_REPUBLISH, ord("2"): DUPLICATE, ord("3"): STALE}


class RedisLuaStateStore(StateStore):
    """Judges and applies a whole batch with one EVALSHA of `apply_batch.lua`."""

    def __init__(
        self,
        redis: Redis,
        *,
        state_ttl_s: int,
        markers_ttl_s: int,
        history_size: int,
    ) -> None:
        self._redis = redis
        self._script = redis.register_script(load_lua("apply_batch.lua"))
        self._head = [state_ttl_s, markers_ttl_s, history_size]

    async def apply(self, events: Sequence[EncodedEvent]) -> list[Judgement]:
        if not events:
            return []
        keys: list[str] = []
        job_index: dict[tuple[str, str], int] = {}
        args: list[str | int | bytes] = list(self._head)
        for item in events:
            event = item.event
            index = job_index.get(event.job_key)
            if index is None:
                index = job_index[event.job_key] = len(job_index) + 1
                job = JobKeys.of(event.domain, event.job_id)
                keys += (job.state, job.history, job.markers)
            args += (index, event.seq, event.stream_id, item.payload)
        with transient_errors("apply batch"):
            codes: bytes = await self._script(keys=keys, args=args)
        return [_JUDGEMENTS[code] for code in codes]

    async def view(self, domain: str, job_id: str) -> JobView:
        job = JobKeys.of(domain, job_id)
        with transient_errors("read job view"):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(job.state)
                pipe.lrange(job.history, 0, -1)
                state, history = await pipe.execute()
        return JobView(state=state, history=list(history))
