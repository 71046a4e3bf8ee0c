"""What the gateway's live feed reports about itself; readiness reads it."""

from __future__ import annotations


class FeedHealth:
    """One record per process, written by the feed's reader and read by the readiness check.

    - No check until a feed starts: a worker serves no viewers and has none.
    - While the reader cannot deliver (its Pub/Sub connection is lost, or it failed and is
      retrying), the `feed` check names the cause; it is "ok" again once a read succeeds.
    """

    def __init__(self) -> None:
        self._started = False
        self._trouble: str | None = None

    def started(self) -> None:
        self._started = True

    def failing(self, cause: str) -> None:
        self._trouble = cause

    def recovered(self) -> None:
        self._trouble = None

    def checks(self) -> dict[str, str]:
        if not self._started:
            return {}
        return {"feed": "ok" if self._trouble is None else f"retrying: {self._trouble}"}
