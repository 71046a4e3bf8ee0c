"""A job's answer text and its one sequence of event ids: what a token does to them, and what
the router writes on each routed event."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

# The answer of an LLM is tens of KiB; a mebibyte bounds a runaway producer, not a real answer.
DEFAULT_TEXT_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TextRecord:
    """What is known of a job's text: the attempt it belongs to (None: no token yet), the seq
    of its last token, its bytes and whether it is full (a token did not fit: the attempt's
    later tokens are not routed)."""

    attempt: int | None = None
    last_seq: int | None = None
    size: int = 0
    full: bool = False


def next_event_id(last_id: int | None, seq: int) -> int:
    """The id the next routed event of a job gets: its seq when that is above every id given
    so far (a job of stage events only keeps its seqs as ids), else the next number (a stage
    event after tokens numbered higher, as the reference chat worker writes them)."""
    if last_id is None or seq > last_id:
        return seq
    return last_id + 1


@dataclass(frozen=True, slots=True)
class TextCheck:
    """What a terminal event tells of the job's final text, for a client to verify its own:
    its UTF-8 bytes, their SHA-1, and whether it was cut at the byte limit."""

    size: int
    sha1: str
    truncated: bool

    @classmethod
    def of(cls, text: bytes, *, truncated: bool) -> TextCheck:
        return cls(len(text), hashlib.sha1(text, usedforsecurity=False).hexdigest(), truncated)


def stamp(
    event_id: int,
    prev_id: int | None,
    *,
    restart: bool = False,
    text_check: TextCheck | None = None,
) -> bytes:
    """The fields the router puts first in a routed event's JSON object: its id, the id of the
    job's event before it (a viewer that did not get that one missed something), whether it
    restarts the job's text (a new attempt's first token) and, on a terminal event of a job
    with a text, the text's check. The Lua apply writes the same bytes."""
    if prev_id is not None and not restart and text_check is None:
        # Most routed events: formatted at once, as the general case below would join them.
        return b'"event_id":%d,"prev_event_id":%d,' % (event_id, prev_id)
    parts = [b'"event_id":%d,' % event_id]
    if prev_id is not None:
        parts.append(b'"prev_event_id":%d,' % prev_id)
    if restart:
        parts.append(b'"restart":true,')
    if text_check is not None:
        parts.append(
            b'"text_check":{"bytes":%d,"sha1":"%s","truncated":%s},'
            % (
                text_check.size,
                text_check.sha1.encode(),
                b"true" if text_check.truncated else b"false",
            )
        )
    return b"".join(parts)


def stamped(payload: bytes, fields: bytes) -> bytes:
    """`payload` (a JSON object with at least one member) with `fields` first in it."""
    return b"{" + fields + payload[1:]


@dataclass(frozen=True, slots=True)
class TextRun:
    """A stretch of a job's text written by one node: bytes `start` to `end`."""

    node: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class JobText:
    """A job's text as stored, read in one atomic step: the bytes, the id and seq of its last
    token, its attempt, which node wrote which stretch, and whether it is full."""

    text: bytes
    last_id: int
    last_seq: int
    attempt: int
    runs: tuple[TextRun, ...] = ()
    full: bool = False

    def by_node(self) -> dict[str, str]:
        """Each named node's text, its stretches joined in order."""
        nodes: dict[str, bytearray] = {}
        for run in self.runs:
            nodes.setdefault(run.node, bytearray()).extend(self.text[run.start : run.end])
        return {node: bytes(text).decode(errors="replace") for node, text in nodes.items()}


def recovery_payload(text: JobText, job_id: str, *, completed: bool) -> bytes:
    """The `token_recovery` a resuming viewer gets in place of the tokens it missed, in the
    reference frontend's shape: `accumulated` replaces its text (exactly the text up to
    `last_seq`); `completed` is true only when nothing follows it on the stream."""
    body = {
        "job_id": job_id,
        "stage": "token_recovery",
        "status": "snapshot",
        "accumulated": text.text.decode(errors="replace"),
        "last_seq": text.last_seq,
        "event_id": text.last_id,
        "attempt": text.attempt,
        "completed": completed,
        "truncated": text.full,
    }
    nodes = text.by_node()
    if nodes:
        body["nodes"] = nodes
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
