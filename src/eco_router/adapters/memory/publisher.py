"""In-memory producer: the same validation and idempotency, appending to `InMemoryStreams`."""

from __future__ import annotations

from typing import Any

from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.adapters.progress_entries import ProducerConfig
from eco_router.application.ports import ProgressPublisher


class InMemoryStreamPublisher(ProgressPublisher):
    """Appends each (job, stage, status) once; a repeat returns the first entry's id."""

    def __init__(self, streams: InMemoryStreams, config: ProducerConfig) -> None:
        self.config = config
        self._streams = streams
        self._first_ids: dict[str, str] = {}

    async def publish_stage_event(
        self,
        job_id: str,
        stage: str,
        status: str,
        *,
        result: Any = None,
        progress: int | None = None,
        seq: int | None = None,
    ) -> str:
        entry = self.config.call(job_id, stage, status, result=result, progress=progress, seq=seq)
        first = self._first_ids.get(entry.idempotency_key)
        if first is None:
            first = self._first_ids[entry.idempotency_key] = self._streams.xadd(
                entry.stream, entry.fields
            )
        return first
