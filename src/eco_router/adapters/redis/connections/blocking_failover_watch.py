"""`failover_watch`'s rules for a blocking client: a Sentinel group's announcements followed
by threads, so that a worker's synchronous publisher leaves the old master as soon as a
failover is announced, as the asyncio one does.

A listening thread per sentinel (daemon, started with the pool's first connection, again in
a forked child, e.g. a Celery prefork worker) passes each announcement to `FailoverState`;
from a promotion, idle connections are closed, those under way once their command is done,
and new ones wait (at most `HOLD_S`) for the end, then ask the sentinels for the master.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from typing import Any

import redis
import redis.sentinel
from redis.exceptions import RedisError

from eco_router.adapters.redis.connections.failover_watch import (
    CHANNELS,
    HOLD_S,
    LISTEN_S,
    RETRY_S,
    Address,
    FailoverState,
    Listeners,
    text,
)

log = logging.getLogger(__name__)


class BlockingFailoverWatch:
    """One Sentinel group's announcements, followed for one blocking connection pool: it is
    emptied and held closed from a promotion until the failover ends."""

    def __init__(
        self, pool: redis.sentinel.SentinelConnectionPool, sentinels: list[redis.Redis]
    ) -> None:
        # Weakly: the listeners end once the pool is dropped, instead of keeping it alive.
        self._pool = weakref.ref(pool)
        self._name = pool.service_name
        self._sentinels = sentinels
        self._state = FailoverState(pool.service_name)
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._stop = threading.Event()
        self._started_in: int | None = None
        self._listeners = Listeners()

    @property
    def listening(self) -> set[int]:
        """The sentinels (their clients' ids) whose announcements arrive now."""
        return self._listeners.listening

    def until_open(self) -> None:
        """Return once no failover holds the group's connections (at most `HOLD_S`)."""
        self.start()
        if self._open.is_set() or self._open.wait(HOLD_S):
            return
        log.warning(
            "%s: no end of the failover announced in %.0f s; asking the sentinels again",
            self._name,
            HOLD_S,
        )
        with self._lock:
            self._state.held = False
        self._open.set()

    def start(self) -> None:
        """Listen to every sentinel, once per process (a fork does not copy threads)."""
        with self._lock:
            if self._started_in == os.getpid():
                return
            self._started_in = os.getpid()
            self.listening.clear()
            for sentinel in self._sentinels:
                threading.Thread(
                    target=self._listen,
                    args=(sentinel,),
                    name=f"sentinel-announcements-{self._name}",
                    daemon=True,
                ).start()

    def stop(self) -> None:
        """End the listening threads (each within `LISTEN_S`)."""
        self._stop.set()

    def promoted_in_place_of(self, address: Address) -> Address:
        """`FailoverState.promoted_in_place_of`, now."""
        with self._lock:
            return self._state.promoted_in_place_of(address, now=time.monotonic())

    def on_announcement(self, channel: str, data: str) -> None:
        with self._lock:
            if not self._state.heard(channel, data, now=time.monotonic()):
                return
            held = self._state.held
        log.info("%s: sentinel announced %s %s", self._name, channel, data)
        if held:
            self._open.clear()
        else:
            self._open.set()
        self._leave_old_master()

    def _leave_old_master(self) -> None:
        """Idle connections are closed now; one under way ends its command (closing it under
        another thread's read would break that read) and is closed when it is given back, so
        its next command connects anew."""
        pool = self._pool()
        if pool is None:
            return
        with pool._lock:
            in_use = list(pool._in_use_connections)
        for connection in in_use:
            connection.mark_for_reconnect()
        with contextlib.suppress(RedisError, OSError):
            pool.disconnect(inuse_connections=False)

    def _listen(self, sentinel: redis.Redis) -> None:
        """Announcements of one sentinel, resubscribed after any failure; a sentinel that is
        down is logged once until it answers again (the others still speak)."""
        while not self._stop.is_set() and self._pool() is not None:
            try:
                with sentinel.pubsub(ignore_subscribe_messages=True) as pubsub:  # type: ignore[no-untyped-call]
                    pubsub.subscribe(*CHANNELS)
                    self._listeners.up(sentinel)
                    while not self._stop.is_set() and self._pool() is not None:
                        message = pubsub.get_message(timeout=LISTEN_S)
                        if message is not None:
                            self.on_announcement(text(message["channel"]), text(message["data"]))
            # Whatever stops a listener, it comes back: without it only failovers are slower
            # to notice.
            except Exception as error:
                self._listeners.down(sentinel, error)
            self._stop.wait(RETRY_S)
        self._listeners.gone(sentinel)


class WatchedBlockingSentinelConnection(redis.sentinel.SentinelManagedConnection):
    """A blocking Sentinel-managed connection that waits out an announced failover before
    it asks for the master, and takes the promoted one while a sentinel still names the old
    one: every (re)connect goes through here."""

    def _connect_retry(self) -> Any:
        proxy = self.connection_pool
        watch: BlockingFailoverWatch | None = getattr(proxy, "failover_watch", None)
        if self._sock or watch is None or not proxy.is_master:
            return super()._connect_retry()  # type: ignore[no-untyped-call]
        watch.until_open()
        named = proxy.get_master_address()
        address = watch.promoted_in_place_of(named)
        if address != named:
            # The pool keeps the connections of the master it knows, and drops the others.
            proxy.master_address = address
        return self.connect_to(address)  # type: ignore[no-untyped-call]


class WatchedBlockingSentinelSSLConnection(
    WatchedBlockingSentinelConnection, redis.connection.SSLConnection
):
    """`WatchedBlockingSentinelConnection` over TLS."""


def watch_failovers_blocking(client: redis.Redis, sentinels: list[redis.Redis]) -> None:
    """Have `client`'s Sentinel pool follow the sentinels' announcements."""
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    watch = BlockingFailoverWatch(pool, sentinels)
    # Connections reach their pool through its proxy: the watch goes where they look.
    pool.proxy.failover_watch = watch  # type: ignore[attr-defined]
    pool.failover_watch = watch  # type: ignore[attr-defined]
