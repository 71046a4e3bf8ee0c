"""What the router's loops report about themselves: quarantined shards, transient episodes,
supervised tasks. Readiness is read from here."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from eco_router.application.errors import PermanentError
from eco_router.application.ports import Clock, HealthMetrics
from eco_router.domain.streams import StreamFamily, families_by_stream, shard_of

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Quarantined:
    """A shard a permanent error took out of routing; tried again at `retry_at_s`."""

    cause: str
    retry_at_s: float
    probing: bool = False


class RouterHealth:
    """One record per process, shared by the loops and the readiness check.

    - A shard whose key the server refuses permanently (`PermanentError`) is quarantined: an
      error log naming the key and cause once per episode, a gauge, a failing readiness
      check; it is tried again every `quarantine_retry_s` and leaves quarantine once a read
      or claim of it succeeds. The other shards go on.
    - A loop failing transiently logs one warning per episode (not per attempt) and fails
      readiness until it succeeds again.
    - A supervised task that died fails readiness until it runs again.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        metrics: HealthMetrics,
        families: Sequence[StreamFamily] = (),
        quarantine_retry_s: float = 10.0,
        idle_check: str | None = "router",
    ) -> None:
        # The check that fails while no task runs yet (None: none; a gateway's own tasks).
        self._idle_check = idle_check
        self._clock = clock
        self._metrics = metrics
        self._family_of = families_by_stream(families)
        self._retry_s = quarantine_retry_s
        self._quarantined: dict[str, Quarantined] = {}
        self._troubles: dict[str, str] = {}
        self._tasks: dict[str, str] = {}

    # --- shards -----------------------------------------------------------------------------

    def quarantine(self, stream: str, error: PermanentError) -> None:
        """Take `stream` out of routing until it is tried again and works."""
        retry_at = self._clock.monotonic() + self._retry_s
        known = self._quarantined.get(stream)
        if known is not None:
            known.cause, known.retry_at_s, known.probing = error.cause, retry_at, False
            return
        self._quarantined[stream] = Quarantined(error.cause, retry_at)
        log.error(
            "shard %s quarantined, the other shards go on; fix the key and it is retried every "
            "%.0f s: %s",
            stream,
            self._retry_s,
            error.cause,
        )
        self._report(stream, quarantined=True)

    def blocked(self) -> frozenset[str]:
        """The quarantined shards not being tried right now: read and claim none of them."""
        return frozenset(s for s, q in self._quarantined.items() if not q.probing)

    def due(self) -> list[str]:
        """The quarantined shards whose time to be tried again has come."""
        now = self._clock.monotonic()
        return [s for s, q in self._quarantined.items() if not q.probing and q.retry_at_s <= now]

    def next_retry_s(self) -> float | None:
        """Seconds until the next quarantined shard is due, None when none waits."""
        waiting = [q.retry_at_s for q in self._quarantined.values() if not q.probing]
        return max(0.0, min(waiting) - self._clock.monotonic()) if waiting else None

    def probing(self) -> list[str]:
        """The quarantined shards being tried right now."""
        return [s for s, q in self._quarantined.items() if q.probing]

    def probe(self, stream: str) -> None:
        """`stream` is being tried again: read or claim it, once."""
        known = self._quarantined.get(stream)
        if known is not None:
            known.probing = True

    def worked(self, streams: Iterable[str]) -> None:
        """A read or claim of these shards succeeded: a probed one leaves quarantine."""
        if not self._quarantined:
            return
        for stream in set(streams):
            known = self._quarantined.get(stream)
            if known is not None and known.probing:
                del self._quarantined[stream]
                log.info("shard %s routes again", stream)
                self._report(stream, quarantined=False)

    def _report(self, stream: str, *, quarantined: bool) -> None:
        family = self._family_of.get(stream)
        if family is not None:
            self._metrics.shard_quarantined(family.domain, shard_of(stream), quarantined)

    # --- transient episodes -----------------------------------------------------------------

    def troubled(self, loop: str, error: Exception) -> None:
        """`loop` failed transiently and will retry; warned once per episode."""
        if loop not in self._troubles:
            log.warning("%s: transient failure, retrying with back-off: %s", loop, error)
        self._troubles[loop] = f"retrying: {error}"

    def untroubled(self, loop: str) -> None:
        if self._troubles.pop(loop, None) is not None:
            log.info("%s: working again", loop)

    def troubled_now(self, loop: str) -> bool:
        return loop in self._troubles

    # --- supervised tasks -------------------------------------------------------------------

    def task_running(self, task: str) -> None:
        self._tasks[task] = "ok"

    def task_failed(self, task: str, state: str) -> None:
        self._tasks[task] = state

    def task_restarted(self, task: str) -> None:
        self._metrics.task_restarted(task)

    def checks(self) -> dict[str, str]:
        """Readiness checks: each supervised task, loop in trouble and quarantined shard."""
        checks = dict(self._tasks)
        if not checks and self._idle_check is not None:
            checks[self._idle_check] = "not running"
        for loop, trouble in self._troubles.items():
            checks[loop] = trouble if checks.get(loop, "ok") == "ok" else checks[loop]
        for stream, known in sorted(self._quarantined.items()):
            checks[f"shard {stream}"] = f"quarantined: {known.cause}"
        return checks
