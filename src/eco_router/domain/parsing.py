"""Turning a raw stream entry into a `JobEvent` or a `Rejection`."""

from __future__ import annotations

import re
from collections.abc import Mapping

from eco_router.domain.event import RESERVED_FIELDS, ROUTER_FIELDS, TOKEN_STAGE, JobEvent
from eco_router.domain.json_result import InvalidResult, parse_result
from eco_router.domain.rejection import Rejection, RejectReason

JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
DEFAULT_MAX_FIELD_BYTES = 64 * 1024
# Seqs are compared as Lua numbers (doubles) in Redis: keep them exactly representable.
MAX_SEQ = 2**53 - 1
_INTEGER = re.compile(r"[+-]?[0-9]+")
# The fields an event has its own members for, and those the router sets.
_NOT_EXTRA = RESERVED_FIELDS | ROUTER_FIELDS
# Producers on the reference design write every field as a string, an absent one as "".
OPTIONAL_FIELDS = ("stage", "status", "ts", "progress", "result")
# Trace context passes through to the published event; the reference producer writes the
# fields empty when it has no span, which would only put "" in front of browsers.
TRACE_FIELDS = ("traceparent", "tracestate", "trace_id", "span_id")
# Fields an empty value stands for the absence of.
_EMPTY_MEANS_ABSENT = (*OPTIONAL_FIELDS, *TRACE_FIELDS)
# W3C Trace Context: version-trace_id-parent_id-flags, lowercase hex; a future version may
# append fields after a dash.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def parse_entry(
    *,
    domain: str,
    stream: str,
    entry_id: str,
    fields: Mapping[bytes, bytes],
    max_field_bytes: int = DEFAULT_MAX_FIELD_BYTES,
) -> JobEvent | Rejection:
    """Validate one entry; every way it can be wrong becomes a `Rejection`, never an exception."""
    text = _text(fields, max_field_bytes)
    if isinstance(text, Rejection):
        return text
    if "" in text.values():
        for name in _EMPTY_MEANS_ABSENT:
            if text.get(name) == "":
                del text[name]
    _keep_valid_trace_context(text)

    job_id = text.get("job_id", "")
    if not job_id:
        return Rejection(RejectReason.MISSING_JOB_ID, "no job_id field")
    if JOB_ID_PATTERN.fullmatch(job_id) is None:
        return Rejection(
            RejectReason.INVALID_JOB_ID, "job_id must be 1-128 characters of [A-Za-z0-9_.:-]"
        )

    raw_seq = text.get("seq", "")
    if not raw_seq:
        return Rejection(RejectReason.MISSING_SEQ, "no seq field")
    seq = _integer(raw_seq)
    if seq is None:
        return Rejection(RejectReason.SEQ_NOT_INTEGER, f"seq {raw_seq[:32]!r} is not an integer")
    if seq > MAX_SEQ:
        return Rejection(RejectReason.SEQ_NOT_INTEGER, f"seq {seq} is above {MAX_SEQ}")
    if seq < 0:
        return Rejection(RejectReason.SEQ_NEGATIVE, f"seq {seq} is negative")

    progress: int | None = None
    raw_progress = text.get("progress")
    if raw_progress is not None:
        progress = _integer(raw_progress)
        # Bounded like seq: readers of the JSON payload hold numbers as doubles.
        if progress is None or abs(progress) > MAX_SEQ:
            return Rejection(
                RejectReason.PROGRESS_NOT_INTEGER,
                f"progress {raw_progress[:32]!r} is not an integer of at most {MAX_SEQ}",
            )

    # A token's attempt fences a retried task's text; on other events it is the producer's.
    attempt = 0
    raw_attempt = text.get("attempt", "")
    if text.get("stage") == TOKEN_STAGE:
        if "content" not in text:
            return Rejection(RejectReason.MISSING_CONTENT, "a token without a content field")
        if raw_attempt:
            parsed = _integer(raw_attempt)
            if parsed is None or not 0 <= parsed <= MAX_SEQ:
                return Rejection(
                    RejectReason.ATTEMPT_NOT_INTEGER,
                    f"attempt {raw_attempt[:32]!r} is not an integer from 0 to {MAX_SEQ}",
                )
            attempt = parsed

    has_result = "result" in text
    result: object = None
    if has_result:
        try:
            result = parse_result(text["result"])
        except InvalidResult as error:
            return Rejection(error.reason, f"result {error}")

    return JobEvent(
        domain=domain,
        stream=stream,
        stream_id=entry_id,
        job_id=job_id,
        seq=seq,
        stage=text.get("stage"),
        status=text.get("status"),
        ts=text.get("ts"),
        progress=progress,
        result=result,
        has_result=has_result,
        extra={name: value for name, value in text.items() if name not in _NOT_EXTRA},
        attempt=attempt,
    )


def _text(fields: Mapping[bytes, bytes], max_field_bytes: int) -> dict[str, str] | Rejection:
    """The fields as text, or why the first field that cannot be is refused."""
    # Every entry read comes here: the whole entry in one pass when it is fine, the fields one
    # by one only to name the first that is not.
    if not fields or max(map(len, fields.values())) <= max_field_bytes:
        try:
            return {name.decode(): value.decode() for name, value in fields.items()}
        except UnicodeDecodeError:
            pass
    for raw_name, raw_value in fields.items():
        if len(raw_value) > max_field_bytes:
            return Rejection(
                RejectReason.FIELD_TOO_LARGE,
                f"field {raw_name[:64]!r} has {len(raw_value)} bytes (max {max_field_bytes})",
            )
        try:
            raw_name.decode()
            raw_value.decode()
        except UnicodeDecodeError:
            return Rejection(RejectReason.NOT_UTF8, f"field {raw_name[:64]!r} is not UTF-8")
    raise AssertionError("unreachable: every field decoded")


def traceparent(text: str) -> str | None:
    """`text` as a W3C `traceparent` (trimmed, in lowercase), or None if it is not one."""
    value = text.strip().lower()
    found = _TRACEPARENT.fullmatch(value)
    if found is None:
        return None
    version, trace_id, parent_id, _, rest = found.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return value


def _keep_valid_trace_context(text: dict[str, str]) -> None:
    """A malformed `traceparent` is dropped with its `tracestate`, as W3C Trace Context tells
    a receiver to; the event itself is never refused for it."""
    raw = text.get("traceparent")
    if raw is None:
        return
    valid = traceparent(raw)
    if valid is None:
        del text["traceparent"]
        text.pop("tracestate", None)
    else:
        text["traceparent"] = valid


def _integer(text: str) -> int | None:
    """The decimal integer `text` spells, or None; never raises, however long the digits."""
    if not (text.isascii() and text.isdigit()) and _INTEGER.fullmatch(text) is None:
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
        return None
