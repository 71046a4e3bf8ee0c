"""What a client is told when a dependency fails, and what the log is told instead.

A public body never carries an adapter's text: redis-py's messages name internal addresses
(`Error 111 connecting to 10.0.0.7:6379`). The client gets one generic line; the cause goes
to the log, with passwords hidden, once per episode rather than once per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from eco_router.adapters.redaction import redact_url

log = logging.getLogger(__name__)

# An episode ends when a kind of failure has not been seen for this long.
EPISODE_QUIET_S = 30.0


def service_of(error: BaseException) -> str:
    """The dependency an error names (`pubsub`, `state store`), else a generic one."""
    service = getattr(error, "service", None)
    return service if isinstance(service, str) else "a dependency"


def public_reason(error: BaseException) -> str:
    """The one line a client may see: which dependency, never how it failed."""
    return f"{service_of(error)} unavailable, retry later"


class EpisodeLog:
    """Logs a failure's cause at warning on the first occurrence of an episode only."""

    def __init__(
        self, *, quiet_s: float = EPISODE_QUIET_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._quiet_s = quiet_s
        self._clock = clock
        self._last_seen: dict[str, float] = {}

    def failed(self, what: str, error: BaseException) -> None:
        """`what` names the episode (one per dependency): its first failure is logged."""
        now = self._clock()
        last = self._last_seen.get(what)
        self._last_seen[what] = now
        if last is not None and now - last < self._quiet_s:
            return
        cause = error.__cause__ or error
        log.warning(
            "%s unavailable (logged once per episode; clients get no detail): %s: %s",
            what,
            type(cause).__name__,
            redact_url(str(cause)),
        )
