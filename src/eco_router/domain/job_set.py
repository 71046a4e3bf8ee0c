"""Many jobs on one stream: the set a client watches, and the stream id that says where each
job of the set stood, relative to the set."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from eco_router.domain.errors import DomainError

# A job as a stream names it: (domain, job id).
Job = tuple[str, str]

# A seq is at most a signed 64-bit integer: 13 base-36 digits.
MAX_SEQ = 2**63 - 1
_SEQ = re.compile(r"[0-9a-z]{1,13}")
_FINGERPRINT = re.compile(r"[A-Za-z0-9_-]{8}")
_FINGERPRINT_BYTES = 6
# The fingerprint, its dot, and per job 13 digits and a comma.
_FIXED_CHARS = 9
_CHARS_PER_JOB = 14


class MalformedStreamId(DomainError):
    """A Last-Event-ID that is not a stream id of a job set."""


class ForeignStreamId(DomainError):
    """A stream id made for another set of jobs: its positions name other jobs."""


@dataclass(frozen=True, slots=True)
class JobSet:
    """The jobs of one stream, distinct, in one canonical order (by domain, then id) whatever
    order the client named them in; the fingerprint names the set in its stream ids."""

    jobs: tuple[Job, ...]
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        text = "\n".join(f"{domain}:{job_id}" for domain, job_id in self.jobs).encode()
        digest = hashlib.blake2b(text, digest_size=_FINGERPRINT_BYTES).digest()
        object.__setattr__(self, "fingerprint", base64.urlsafe_b64encode(digest).decode())

    @classmethod
    def of(cls, jobs: Iterable[Job]) -> JobSet:
        return cls(tuple(sorted(set(jobs))))

    def __len__(self) -> int:
        return len(self.jobs)


def max_stream_id_chars(jobs: int) -> int:
    """The longest stream id of a set of `jobs` jobs: what bounds a Last-Event-ID's size."""
    return _FIXED_CHARS + _CHARS_PER_JOB * jobs


def encode_seq(seq: int | None) -> str:
    """One job's position in a stream id: its last event id in base 36, empty for none yet."""
    if seq is None:
        return ""
    digits = []
    while True:
        seq, digit = divmod(seq, 36)
        digits.append("0123456789abcdefghijklmnopqrstuvwxyz"[digit])
        if not seq:
            return "".join(reversed(digits))


def stream_id(job_set: JobSet, positions: Sequence[str]) -> str:
    """`<fingerprint>.<p0>,<p1>,...`: each job's `encode_seq`, in the set's order."""
    return f"{job_set.fingerprint}.{','.join(positions)}"


def read_stream_id(job_set: JobSet, value: str) -> list[int | None]:
    """Each job's last event id, in the set's order, from a stream id made for `job_set`.

    - `MalformedStreamId` for anything that is not a stream id of a set of this size, or
      longer than one can be.
    - `ForeignStreamId` for a stream id of another set: its positions cannot be mapped.
    """
    if len(value) > max_stream_id_chars(len(job_set)):
        raise MalformedStreamId("Last-Event-ID is longer than a stream id of this job set")
    fingerprint, dot, rest = value.partition(".")
    if not dot or _FINGERPRINT.fullmatch(fingerprint) is None:
        raise MalformedStreamId("Last-Event-ID is not a stream id (<fingerprint>.<positions>)")
    if fingerprint != job_set.fingerprint:
        raise ForeignStreamId(
            "Last-Event-ID was made for another set of jobs: reconnect without it"
        )
    parts = rest.split(",")
    if len(parts) != len(job_set):
        raise MalformedStreamId("Last-Event-ID does not hold one position per job of the set")
    positions: list[int | None] = []
    for part in parts:
        if not part:
            positions.append(None)
            continue
        if _SEQ.fullmatch(part) is None or (seq := int(part, 36)) > MAX_SEQ:
            raise MalformedStreamId("Last-Event-ID holds a position that is not a seq")
        positions.append(seq)
    return positions
