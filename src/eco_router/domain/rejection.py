"""Why an entry cannot be routed."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RejectReason(StrEnum):
    """The reasons an entry goes to the dead-letter stream."""

    MISSING_JOB_ID = "missing_job_id"
    INVALID_JOB_ID = "invalid_job_id"
    MISSING_SEQ = "missing_seq"
    SEQ_NOT_INTEGER = "seq_not_integer"
    SEQ_NEGATIVE = "seq_negative"
    PROGRESS_NOT_INTEGER = "progress_not_integer"
    NOT_UTF8 = "not_utf8"
    RESULT_NOT_JSON = "result_not_json"
    RESULT_NOT_FINITE = "result_not_finite"
    FIELD_TOO_LARGE = "field_too_large"
    MISSING_CONTENT = "missing_content"
    ATTEMPT_NOT_INTEGER = "attempt_not_integer"
    TOO_LARGE = "too_large"
    MAX_DELIVERIES = "max_deliveries"


@dataclass(frozen=True, slots=True)
class Rejection:
    """An entry judged INVALID, with the reason and a human-readable detail."""

    reason: RejectReason
    detail: str
