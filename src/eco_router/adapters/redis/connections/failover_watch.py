"""Leaving a Sentinel group's old master as soon as the sentinels announce a failover.

redis-py asks the sentinels for the master only when it opens a connection: connections
already open stay on the old master after a failover until it refuses a write (READONLY),
and in a failover asked of Sentinel (`SENTINEL FAILOVER`, a rolling update) the old master
stays up and writable until Sentinel reconfigures it, seconds later. Every write it takes in
between is thrown away when it becomes a replica of the promoted one; its remaining replica
may even acknowledge them first, so WAIT does not protect them.

The sentinel leading a failover announces the promotion it is about to send
(`+failover-state-send-slaveof-noone`), and every sentinel announces the end
(`+switch-master`). From the first, idle connections to the group are closed, those under
way once their command is done, and no new one is made; from the second (or an abort, or
`HOLD_S` at most), new connections ask the sentinels again, who name the promoted master.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import SSLConnection
from redis.asyncio.sentinel import SentinelConnectionPool, SentinelManagedConnection
from redis.exceptions import RedisError

from eco_router.application.stopping import cancel_and_wait

log = logging.getLogger(__name__)

PROMOTING = "+failover-state-send-slaveof-noone"
SWITCHED = "+switch-master"
ABORTED = (
    "-failover-abort-not-elected",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout",
)
CHANNELS = (PROMOTING, SWITCHED, *ABORTED)
# Longest wait for the end of a failover once its promotion was announced: Sentinel ends one
# in about a second; a leader that died meanwhile must not stop the clients for good.
HOLD_S = 10.0
RETRY_S = 1.0
# A listener's wait for the next announcement: shorter than the sentinel client's socket
# timeout, which would otherwise end a quiet subscription with a timeout error.
LISTEN_S = 1.0


Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Announcement:
    """What a sentinel's announcement means for one master's clients: `hold` (its master is
    about to be replaced) or not (the failover ended or was given up), and for an end, the
    master replaced and the one promoted."""

    hold: bool
    moved: tuple[Address, Address] | None = None


def announced(master_name: str, channel: str, data: str) -> Announcement | None:
    """The meaning of `data` on `channel` for `master_name`, or None."""
    words = data.split()
    if channel == PROMOTING:
        # "slave <name> <ip> <port> @ <master name> <master ip> <master port>"
        return Announcement(hold=True) if words[4:6] == ["@", master_name] else None
    if channel == SWITCHED:
        # "<master name> <old ip> <old port> <new ip> <new port>"
        if len(words) != 5 or words[0] != master_name:
            return None
        old, new = (words[1], int(words[2])), (words[3], int(words[4]))
        return Announcement(hold=False, moved=(old, new))
    if channel in ABORTED:
        # "master <name> <ip> <port>"
        return Announcement(hold=False) if words[:2] == ["master", master_name] else None
    return None


class FailoverState:
    """What one master's clients know of its failovers from the sentinels' announcements,
    whichever client (blocking or asyncio) follows them: whether a promotion holds new
    connections back, and the last failover (the master replaced and the one promoted)."""

    def __init__(self, master_name: str) -> None:
        self.master_name = master_name
        self.held = False
        self.moved: tuple[Address, Address] | None = None
        self._moved_at = 0.0

    def heard(self, channel: str, data: str, *, now: float) -> bool:
        """Take in one announcement; True when the clients must leave the old master now
        (each sentinel announces the same end: only the first one counts)."""
        meaning = announced(self.master_name, channel, data)
        if meaning is None or (meaning.moved is not None and meaning.moved == self.moved):
            return False
        if meaning.hold:
            self.held = True
        else:
            if meaning.moved is not None:
                self.moved, self._moved_at = meaning.moved, now
            self.held = False
        return True

    def promoted_in_place_of(self, address: Address, *, now: float) -> Address:
        """The master announced in place of `address` (a sentinel that has not heard of the
        failover yet still names the old one), else `address`. Only for `HOLD_S` after the
        announcement: by then every sentinel knows, and a later failover back to `address`
        this watch missed must not be overruled."""
        if self.moved is None or self.moved[0] != address or now - self._moved_at > HOLD_S:
            return address
        return self.moved[1]


class Listeners:
    """Which sentinels' announcements arrive now (their clients' ids, in `listening`), for
    a listener of either kind: a sentinel that stops answering is logged once, and again
    once it answers."""

    def __init__(self) -> None:
        self.listening: set[int] = set()
        self._failing: set[int] = set()

    def up(self, sentinel: Any) -> None:
        self.listening.add(id(sentinel))
        if id(sentinel) in self._failing:
            self._failing.discard(id(sentinel))
            log.info("sentinel %s answers again", _address(sentinel))

    def down(self, sentinel: Any, error: BaseException) -> None:
        self.listening.discard(id(sentinel))
        if id(sentinel) not in self._failing:
            self._failing.add(id(sentinel))
            log.warning(
                "sentinel %s: not following its failover announcements (%s); retrying every %.0f s",
                _address(sentinel),
                type(error).__name__,
                RETRY_S,
            )

    def gone(self, sentinel: Any) -> None:
        self.listening.discard(id(sentinel))


class FailoverWatch:
    """One Sentinel group's announcements, followed for one connection pool: it is emptied
    and held closed from a promotion until the failover ends."""

    def __init__(self, pool: SentinelConnectionPool, sentinels: list[Redis]) -> None:
        self._pool = pool
        self._sentinels = sentinels
        self._open = asyncio.Event()
        self._open.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._leaving: set[asyncio.Task[None]] = set()
        self._state = FailoverState(pool.service_name)
        self._listeners = Listeners()

    @property
    def listening(self) -> set[int]:
        """The sentinels (their clients' ids) whose announcements arrive now."""
        return self._listeners.listening

    async def until_open(self) -> None:
        """Return once no failover holds the group's connections (at most `HOLD_S`)."""
        self.start()
        if self._open.is_set():
            return
        try:
            async with asyncio.timeout(HOLD_S):
                await self._open.wait()
        except TimeoutError:
            log.warning(
                "%s: no end of the failover announced in %.0f s; asking the sentinels again",
                self._pool.service_name,
                HOLD_S,
            )
            self._state.held = False
            self._open.set()

    @property
    def moved(self) -> tuple[Address, Address] | None:
        """The last failover announced: (the master replaced, the one promoted)."""
        return self._state.moved

    def start(self) -> None:
        """Listen to every sentinel (once; needs a running event loop)."""
        if self._tasks:
            return
        for sentinel in self._sentinels:
            task = asyncio.create_task(self._listen(sentinel), name="sentinel-announcements")
            self._tasks.add(task)

    async def aclose(self) -> None:
        tasks = [*self._tasks, *self._leaving]
        self._tasks.clear()
        # A listener's cancel can be dropped inside redis-py's reads (see cancel_and_wait).
        await cancel_and_wait(tasks)

    def promoted_in_place_of(self, address: Address) -> Address:
        """`FailoverState.promoted_in_place_of`, now."""
        return self._state.promoted_in_place_of(address, now=asyncio.get_running_loop().time())

    def on_announcement(self, channel: str, data: str) -> None:
        if not self._state.heard(channel, data, now=asyncio.get_running_loop().time()):
            return
        log.info("%s: sentinel announced %s %s", self._pool.service_name, channel, data)
        if self._state.held:
            self._open.clear()
        else:
            self._open.set()
        task = asyncio.create_task(self._leave_old_master(), name="failover-leave")
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _leave_old_master(self) -> None:
        """Idle connections are closed now; one under way ends its command (closing it under
        a read would hand its caller redis-py's raw errors) and is closed when it is given
        back, so its next command connects anew."""
        for connection in list(self._pool._get_in_use_connections()):
            connection.mark_for_reconnect()  # type: ignore[no-untyped-call]
        with contextlib.suppress(RedisError, OSError):
            await self._pool.disconnect(inuse_connections=False)

    async def _listen(self, sentinel: Redis) -> None:
        """Announcements of one sentinel, resubscribed after any failure; a sentinel that is
        down is logged once until it answers again (the others still speak)."""
        while True:
            try:
                async with sentinel.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(*CHANNELS)
                    self._listeners.up(sentinel)
                    while True:
                        message = await pubsub.get_message(timeout=LISTEN_S)
                        if message is not None:
                            self.on_announcement(text(message["channel"]), text(message["data"]))
            # Whatever stops a listener, it comes back: without it only failovers are slower
            # to notice.
            except Exception as error:
                self._listeners.down(sentinel, error)
            await asyncio.sleep(RETRY_S)


class WatchedSentinelPoolMixin:
    """A Sentinel pool's side of `FailoverWatch`: made with the pool, stopped with it."""

    failover_watch: FailoverWatch
    master_address: Address | None

    def watch_failovers(self, sentinels: list[Redis]) -> None:
        assert isinstance(self, SentinelConnectionPool)
        self.failover_watch = FailoverWatch(self, sentinels)

    async def get_master_address(self) -> Address:
        address: Address = await super().get_master_address()  # type: ignore[misc]
        promoted = self.failover_watch.promoted_in_place_of(address)
        if promoted != address:
            self.master_address = promoted
        return promoted

    async def aclose(self) -> None:
        # The client's aclose() closes its pool: the watch ends with it.
        await self.failover_watch.aclose()
        await super().aclose()  # type: ignore[misc]


def watch_failovers(client: Redis, sentinels: list[Redis]) -> None:
    """Have `client`'s pool (a `WatchedSentinelPoolMixin`) follow the sentinels'
    announcements."""
    pool = client.connection_pool
    assert isinstance(pool, WatchedSentinelPoolMixin)
    pool.watch_failovers(sentinels)


class WatchedSentinelConnection(SentinelManagedConnection):
    """A Sentinel-managed connection that waits out an announced failover before it asks
    for the master: every (re)connect goes through here, a pooled command's, a retry's and a
    Pub/Sub's."""

    async def _connect_retry(self) -> Any:
        if not self._reader:
            watch: FailoverWatch | None = getattr(self.connection_pool, "failover_watch", None)
            if watch is not None:
                await watch.until_open()
        return await super()._connect_retry()  # type: ignore[no-untyped-call]


class WatchedSentinelSSLConnection(WatchedSentinelConnection, SSLConnection):
    """`WatchedSentinelConnection` over TLS."""


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _address(sentinel: Any) -> str:
    kwargs = sentinel.connection_pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}"
