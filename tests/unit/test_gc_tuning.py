"""The collector settings of the long-running processes: frozen survivors, periodic sweeps."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from eco_router.entrypoints import gc_tuning


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def settled() -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc_tuning.settle_garbage_collector()
    yield
    gc.callbacks.remove(gc_tuning._collections)
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def a_cycle() -> tuple[Node, weakref.ref[Node]]:
    node = Node()
    node.other = Node()
    node.other.other = node
    return node, weakref.ref(node)


class TestFullCollections:
    def test_a_full_collection_freezes_what_survived_it(self, settled: None) -> None:
        frozen = gc.get_freeze_count()
        kept = [Node() for _ in range(1_000)]
        gc.collect()
        assert gc.get_freeze_count() >= frozen + len(kept)

    def test_a_middle_generation_collection_freezes_what_survived_it_too(
        self, settled: None
    ) -> None:
        frozen = gc.get_freeze_count()
        kept = [Node() for _ in range(1_000)]
        gc.collect(1)
        assert gc.get_freeze_count() >= frozen + len(kept)

    def test_a_cycle_frozen_while_alive_is_kept_until_the_sweep(self, settled: None) -> None:
        node, ref = a_cycle()
        gc.collect()  # frozen while alive
        del node
        gc.collect()
        assert ref() is not None
        gc_tuning._State.last_sweep = time.monotonic() - gc_tuning.FULL_SWEEP_S - 1
        gc.collect()
        assert ref() is None
