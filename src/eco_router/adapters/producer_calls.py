"""The producer SDK's calls as its users write them, once for every publisher: blocking,
asyncio and in memory."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from eco_router.domain.progress import StageEvent

# What a publisher's call returns: the entry id (blocking) or an awaitable of it (asyncio).
Returned = TypeVar("Returned")


class StageEventCalls(Generic[Returned]):
    """`publish_stage_event(job_id, stage, status, ...)`, the documented call, for a publisher
    that publishes a `StageEvent`."""

    def publish(self, event: StageEvent) -> Returned:
        """Append the event once; the same (job, stage, status) again gives the first id."""
        raise NotImplementedError

    def publish_stage_event(
        self,
        job_id: str,
        stage: str,
        status: str,
        *,
        result: Any = None,
        progress: int | None = None,
        seq: int | None = None,
    ) -> Returned:
        """`publish(StageEvent(...))`: returns the stream entry id."""
        return self.publish(StageEvent(job_id, stage, status, result, progress, seq))
