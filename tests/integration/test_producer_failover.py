"""The blocking publisher (`connect`) behind Sentinel leaves the old master as soon as a
failover is announced, as the asyncio one does.

In a failover asked of Sentinel (`SENTINEL FAILOVER`, a rolling update) the old master stays
up and writable until Sentinel makes it a replica of the promoted one, seconds later, and
then throws away what it took meanwhile, though its other replica acknowledged it (WAIT 1).
A publisher that kept writing there would be given entry ids of events that are gone.
"""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from eco_router.adapters.redis.connections.blocking_failover_watch import BlockingFailoverWatch
from eco_router.producer import StreamPublisher, connect, producer_config
from eco_router.testing import SentinelGroup
from tests.integration.topology_fixtures import Shared

pytestmark = pytest.mark.integration

CONFIG = producer_config(domain="scan", shards=4, wait_replicas=1, wait_timeout_ms=1000)
WRITERS = 4
LISTENER = "sentinel-announcements-"


@pytest.fixture
def group(shared_sentinel: Shared[SentinelGroup]) -> Iterator[SentinelGroup]:
    """The shared Sentinel group, started again for the next test (this one fails it over)."""
    try:
        yield shared_sentinel.get()
    finally:
        shared_sentinel.broken = True


class Writers:
    """Threads publishing one `queued` event of a new job each, as fast as they can; what a
    call returned an entry id for is acknowledged."""

    def __init__(self, publisher: StreamPublisher) -> None:
        self.publisher = publisher
        self.acknowledged: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._write, args=(n,)) for n in range(WRITERS)]

    def __enter__(self) -> Writers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def count(self) -> int:
        with self._lock:
            return len(self.acknowledged)

    def _write(self, writer: int) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            job = f"job-{writer}-{n}"
            # A call refused (its connection closed under it, the replica behind) is not
            # acknowledged: the worker would call again.
            try:
                entry_id = self.publisher.publish_stage_event(job, "queued", "queued")
            except (redis.RedisError, OSError):
                time.sleep(0.01)
                continue
            with self._lock:
                self.acknowledged[job] = entry_id
            time.sleep(0.002)


def kept_events(group: SentinelGroup) -> dict[str, str]:
    """Every job's entry id in the streams of the current master."""
    client = redis.Redis.from_url(group.master().url)
    try:
        found: dict[str, str] = {}
        for shard in range(CONFIG.family.shards):
            for entry_id, fields in client.xrange(f"scan:events:{shard}"):
                found[fields[b"job_id"].decode()] = entry_id.decode()
        return found
    finally:
        client.close()


def until_every_sentinel_is_listened_to(publisher: StreamPublisher, sentinels: int) -> None:
    """The watch listens from the first connection on; a failover asked before it hears the
    sentinels is not what this test is about."""
    watch = publisher._client.connection_pool.failover_watch  # type: ignore[attr-defined]
    assert isinstance(watch, BlockingFailoverWatch)
    for _ in range(200):
        if len(watch.listening) == sentinels:
            return
        time.sleep(0.05)
    raise AssertionError("the publisher does not hear every sentinel")


class TestABlockingPublisherThroughAFailoverAskedOfSentinel:
    def test_no_event_it_acknowledged_during_the_failover_is_lost(
        self, group: SentinelGroup
    ) -> None:
        publisher = connect(group.url, CONFIG)
        publisher.publish_stage_event("job-first", "queued", "queued")
        until_every_sentinel_is_listened_to(publisher, len(group.sentinels))

        with Writers(publisher) as writers:
            time.sleep(0.3)
            old = group.failover()
            began = time.monotonic()
            group.wait_for_new_master(old)
            group.wait_rejoined(old, 60.0)
            demoted_s = time.monotonic() - began
            before_end = writers.count()
            time.sleep(0.3)

        kept = kept_events(group)
        lost = [job for job, entry_id in writers.acknowledged.items() if kept.get(job) != entry_id]
        assert demoted_s > 1.0, "the old master was demoted at once: nothing here was at risk"
        assert len(writers.acknowledged) > before_end, "no event went to the promoted master"
        assert lost == [], f"{len(lost)} of {len(writers.acknowledged)} acknowledged events lost"


class TestAForkedWorker:
    """A Celery prefork worker forks after the module made its publisher: a fork copies no
    thread, so the child listens to the sentinels again from its own first connection."""

    def test_a_child_forked_after_the_first_connection_listens_to_every_sentinel(
        self, sentinel_group: SentinelGroup
    ) -> None:
        publisher = connect(sentinel_group.url, producer_config(domain="scan", shards=4))
        publisher.publish_stage_event("job-parent", "queued", "queued")
        sentinels = len(sentinel_group.sentinels)
        until_every_sentinel_is_listened_to(publisher, sentinels)
        fork = multiprocessing.get_context("fork")
        answers = fork.Queue()

        child = fork.Process(target=listeners_in_a_child, args=(publisher, sentinels, answers))
        child.start()
        listeners = answers.get(timeout=60)
        child.join()

        assert listeners == sentinels
        assert child.exitcode == 0


def listeners_in_a_child(
    publisher: StreamPublisher, sentinels: int, answers: multiprocessing.Queue[int]
) -> None:
    """In the forked child: publish, then say how many listening threads run here."""
    publisher.publish_stage_event("job-child", "queued", "queued")
    until_every_sentinel_is_listened_to(publisher, sentinels)
    answers.put(sum(t.name.startswith(LISTENER) for t in threading.enumerate()))
