"""Recording a viewer's control message (cancel, input) for a job's worker."""

from __future__ import annotations

from eco_router.application.errors import (
    ControlExhausted,
    ControlLimited,
    JobEnded,
    RequestIdConflict,
    TransientError,
    UnknownJob,
)
from eco_router.application.ports import Clock, ControlStore
from eco_router.domain.control import (
    ControlLimits,
    ControlReceipt,
    ControlRequest,
    Recorded,
    admit,
)

# Each try loses only to another write on the same job between its read and its write.
MAX_TRIES = 8


class SendControl:
    """Records a valid control request durably, with its announcement to every viewer.

    - The rules are `admit`'s: the store reads the job's control log, the rules decide, and
      the store writes what they admitted only if the log is still as read (else this reads
      again): two gateways never both take the last place under a bound.
    - The message and its lifecycle event (`cancel_requested`, `input_received`) are written
      in one atomic step on the streams server before this returns: a crash of any process
      afterwards loses neither (the router routes the announcement from the shard stream).
    - A request id its sender used before is applied once: its first receipt is the answer;
      used for the other kind, it is refused (`RequestIdConflict`).
    - A job without any event is refused (`UnknownJob`), one that has ended too (`JobEnded`);
      a request id recorded before the end still answers its receipt.
    - A second cancel answers the first; an input past the bounds is refused
      (`ControlLimited` with when to retry, or `ControlExhausted`).
    """

    def __init__(
        self, *, store: ControlStore, clock: Clock, limits: ControlLimits | None = None
    ) -> None:
        self._store = store
        self._clock = clock
        self._limits = limits or ControlLimits()

    async def __call__(self, request: ControlRequest) -> ControlReceipt:
        for _ in range(MAX_TRIES):
            seen = await self._store.control_log(request)
            admission = admit(request, seen, self._limits, self._clock.now_ms())
            if admission.refused is not None:
                return _answer(request, admission.refused)
            message_id = await self._store.append(request, admission, version=seen.version)
            if message_id is not None:
                return ControlReceipt(
                    Recorded.NEW, request.request_id, message_id, admission.number, request.kind
                )
        raise TransientError(f"job {request.job_id}'s control log kept changing; retry")


def _answer(request: ControlRequest, receipt: ControlReceipt) -> ControlReceipt:
    """The receipt of a request that wrote nothing, or the error that refuses it."""
    job = request.job_id
    match receipt.outcome:
        case Recorded.DUPLICATE | Recorded.CANCELLED_BEFORE:
            return receipt
        case Recorded.ENDED:
            raise JobEnded(f"job {job} has already ended")
        case Recorded.UNKNOWN_JOB:
            raise UnknownJob(f"job {job} has no event yet (unknown, or expired)")
        case Recorded.KIND_CONFLICT:
            raise RequestIdConflict(receipt.detail)
        case Recorded.EXHAUSTED:
            raise ControlExhausted(f"job {job}: {receipt.detail}")
        case _:
            raise ControlLimited(
                f"job {job}: {receipt.detail}; retry later",
                retry_after_s=receipt.retry_after_s or 1,
            )
