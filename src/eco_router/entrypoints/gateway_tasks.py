"""The gateway's own background tasks, owned by the app's lifespan: posting its viewer counts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from types import TracebackType

from eco_router.application.backoff import Backoff
from eco_router.application.errors import TransientError
from eco_router.application.periodic import run_every
from eco_router.application.stopping import cancel_and_wait
from eco_router.application.supervision import supervise
from eco_router.entrypoints.container import Container
from eco_router.entrypoints.resolve import resolve

log = logging.getLogger(__name__)

# Changes within this long of a post go in the next one together (never longer than the period).
BATCH_S = 1.0


class GatewayTasks:
    """Async context: runs the presence poster, supervised, while the app serves.

    - It posts this gateway's viewer counts every `presence_interval_s`, and within `BATCH_S`
      of a stream opening or closing; a transient failure is one warning per episode and a
      failing `presence` readiness check until a post succeeds again (retried with back-off);
      a task that dies on a bug is logged, counted in `event_router_task_restarts_total`
      and started again with back-off, for as long as the gateway runs: the streams do not
      depend on it.
    - On exit it is stopped (cancelled past `stop_timeout_s`) and the gateway's counts leave
      the board at once, before the connections close.
    """

    def __init__(self, container: Container, *, stop_timeout_s: float = 2.0) -> None:
        self._container = container
        self._stop_timeout_s = stop_timeout_s
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> GatewayTasks:
        container = self._container
        interval_s = container.settings().presence_interval_s
        health = await resolve(container.gateway_health())
        tally = await resolve(container.viewer_tally())
        post = await resolve(container.post_viewer_counts())
        self._leave = post.leave

        def posting() -> Coroutine[object, object, None]:
            return run_every(
                interval_s,
                self._stop,
                post,
                name="presence",
                health=health,
                soon=tally.changed,
                soon_after_s=min(BATCH_S, interval_s),
            )

        self._task = asyncio.create_task(
            supervise(
                "presence",
                posting,
                self._stop,
                health=health,
                backoff=Backoff(initial_s=0.5, max_s=interval_s),
                max_restarts=None,
                restart_window_s=container.settings().task_restart_window_s,
            ),
            name="presence",
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._task is None:
            return
        done, _ = await asyncio.wait({self._task}, timeout=self._stop_timeout_s)
        if not done:
            await cancel_and_wait([self._task])
        elif (error := self._task.exception()) is not None:
            log.error("the presence task ended with an error", exc_info=error)
        try:
            async with asyncio.timeout(self._stop_timeout_s):
                await self._leave()
        except (TransientError, TimeoutError) as error:
            # Its counts lapse by themselves within a few periods.
            log.info("viewer counts not removed (they lapse by themselves): %s", error)
