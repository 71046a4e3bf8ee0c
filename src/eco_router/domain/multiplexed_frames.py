"""A job's SSE frames retold on a stream of many jobs: each names its job and carries the
stream id of the whole set."""

from __future__ import annotations

from eco_router.domain.sse import Frame


def job_frame(frame: Frame, *, domain: str, job_id: str, stream_id: str) -> Frame:
    """The frame on a stream of many jobs: the same event name, `data:` wrapping the job's
    own data as `{"domain": ..., "job_id": ..., "data": ...}`, and the set's stream id."""
    # domain and job_id are checked against JSON-safe alphabets before any stream opens.
    data = b'{"domain":"%s","job_id":"%s","data":%s}' % (
        domain.encode(),
        job_id.encode(),
        frame.data,
    )
    encoded = b"id: %s\nevent: %s\ndata: %s\n\n" % (stream_id.encode(), frame.name.encode(), data)
    return Frame(frame.event_id, frame.name, data, encoded)
