"""Recording a viewer's control message (cancel, input) for a job's worker."""

from __future__ import annotations

from eco_router.application.errors import JobEnded
from eco_router.application.ports import ControlStore
from eco_router.domain.control import ControlReceipt, ControlRequest, Recorded


class SendControl:
    """Records a valid control request durably, with its announcement to every viewer.

    - The message and its lifecycle event (`cancel_requested`, `input_received`) are written
      in one atomic step on the streams server before this returns: a crash of any process
      afterwards loses neither (the router routes the announcement from the shard stream).
    - A request id seen before is applied once: its first receipt is the answer.
    - A job that has ended refuses it (`JobEnded`); a request id recorded before the end
      still answers its receipt.
    """

    def __init__(self, *, store: ControlStore) -> None:
        self._store = store

    async def __call__(self, request: ControlRequest) -> ControlReceipt:
        receipt = await self._store.record(request)
        if receipt.outcome is Recorded.ENDED:
            raise JobEnded(f"job {request.job_id} has already ended")
        return receipt
