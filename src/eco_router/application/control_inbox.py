"""A worker's side of its job's control messages: cancelled yet, the next message, and each
message acknowledged once handled."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from eco_router.application.ports import ControlStore
from eco_router.domain.control import ControlMessage
from eco_router.domain.control_reading import ControlReading, Deliver, KnownCancels


class ControlInbox:
    """The control messages of one domain's jobs, as its worker reads them (the loop is
    `ControlReading`'s; this runs it on a `ControlStore`).

    - `cancelled` costs one read while no cancel is known, none once one is (a cancel is
      never withdrawn).
    - A message is handed at least once: to every reader until one acknowledges it, so a
      worker restarted before its acknowledgement gets it again.
    - Nothing is handed once the job's state is its end.
    """

    def __init__(self, store: ControlStore, domain: str) -> None:
        self._store = store
        self._domain = domain
        self._cancels = KnownCancels()

    async def cancelled(self, job_id: str) -> bool:
        """Whether a cancel was recorded for the job."""
        if self._cancels.known(job_id):
            return True
        return self._cancels.read(job_id, await self._store.cancelled(self._domain, job_id))

    async def messages(
        self, job_id: str, *, timeout_s: float | None = None
    ) -> AsyncIterator[ControlMessage]:
        """Each unacknowledged message of the job once, in order, waiting for more; ends when
        the job has ended or after `timeout_s` (None: only at the job's end)."""
        reading = ControlReading(timeout_s=timeout_s, now=time.monotonic())
        while (step := reading.next_step(time.monotonic())) is not None:
            if isinstance(step, Deliver):
                pending = await self._store.deliver(self._domain, job_id, after=step.after)
                for message in reading.delivered(pending):
                    yield message
            else:
                await self._store.wait(
                    self._domain, job_id, after=step.after, timeout_s=step.timeout_s
                )

    async def next(self, job_id: str, *, timeout_s: float) -> ControlMessage | None:
        """The job's first unacknowledged message, waiting up to `timeout_s` for one (None:
        none came, or the job has ended). The same one again until it is acknowledged."""
        async for message in self.messages(job_id, timeout_s=timeout_s):
            return message
        return None

    async def acknowledge(self, message: ControlMessage) -> bool:
        """Retire a handled message: never handed again (False: not held any more)."""
        return await self._store.acknowledge(message.domain, message.job_id, message.message_id)
