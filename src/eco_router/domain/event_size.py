"""How large a routed event and a job's history may grow."""

from __future__ import annotations

from dataclasses import dataclass

from eco_router.domain.event import ends_job
from eco_router.domain.rejection import Rejection, RejectReason

DEFAULT_MAX_EVENT_BYTES = 8 * 1024
DEFAULT_MAX_RESULT_BYTES = 128 * 1024
DEFAULT_HISTORY_MAX_BYTES = 1024 * 1024


def carries_outcome(*, stage: str | None, status: str | None, has_result: bool) -> bool:
    """A result, `done` or a failure: the events allowed the larger limit."""
    return has_result or ends_job(stage, status)


@dataclass(frozen=True, slots=True)
class EventSizeLimits:
    """The largest routed event, as its JSON payload: small for a stage event, larger for one
    carrying a result or ending the job (`carries_outcome`)."""

    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES

    def limit_for(self, *, stage: str | None, status: str | None, has_result: bool) -> int:
        if carries_outcome(stage=stage, status=status, has_result=has_result):
            return max(self.max_result_bytes, self.max_event_bytes)
        return self.max_event_bytes

    def check(
        self, size: int, *, stage: str | None, status: str | None, has_result: bool
    ) -> Rejection | None:
        """A `too_large` rejection when a payload of `size` bytes is above its limit."""
        outcome = carries_outcome(stage=stage, status=status, has_result=has_result)
        limit = self.limit_for(stage=stage, status=status, has_result=has_result)
        if size <= limit:
            return None
        kind = "an event with a result or ending the job" if outcome else "a stage event"
        return Rejection(
            RejectReason.TOO_LARGE, f"{size} bytes as routed JSON, above {limit} for {kind}"
        )


DEFAULT_SIZE_LIMITS = EventSizeLimits()
