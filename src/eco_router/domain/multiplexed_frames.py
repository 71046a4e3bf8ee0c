"""A job's SSE frames retold on a stream of many jobs: each names its job and carries the
stream id of the whole set."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobFrame:
    """One frame of a job's own stream (`domain.sse`): its id (None for a snapshot or an error
    notice), its event name and its data line."""

    event_id: int | None
    name: bytes
    data: bytes


def read_frames(chunk: bytes) -> list[JobFrame]:
    """The frames of a chunk of a job's stream, as `domain.sse` writes them (`id:`, `event:`,
    `data:` lines, one data line of JSON); comments (keepalives) are left out."""
    frames = []
    for frame in chunk.split(b"\n\n"):
        if not frame or frame.startswith(b":"):
            continue
        event_id = None
        if frame.startswith(b"id: "):
            line, _, frame = frame.partition(b"\n")
            event_id = int(line[4:])
        name, _, data = frame.partition(b"\n")
        if not name.startswith(b"event: ") or not data.startswith(b"data: "):
            raise ValueError(f"not a job's frame: {frame[:80]!r}")
        frames.append(JobFrame(event_id, name[7:], data[6:]))
    return frames


def job_frame(frame: JobFrame, *, domain: str, job_id: str, stream_id: str) -> bytes:
    """The frame on a stream of many jobs: the same event name, `data:` wrapping the job's
    own data as `{"domain": ..., "job_id": ..., "data": ...}`, and the set's stream id."""
    # domain and job_id are checked against JSON-safe alphabets before any stream opens.
    return b'id: %s\nevent: %s\ndata: {"domain":"%s","job_id":"%s","data":%s}\n\n' % (
        stream_id.encode(),
        frame.name,
        domain.encode(),
        job_id.encode(),
        frame.data,
    )
