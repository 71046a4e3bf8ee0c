"""The collector settings of the long-running processes (frozen survivors, periodic sweeps)
and of every command's start and exit."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable, Iterator

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


class TestCommandStartAndExit:
    def test_start_up_imports_run_uncollected_and_stay_frozen(self) -> None:
        try:
            with gc_tuning.start_up_uncollected():
                paused = not gc.isenabled()
                kept = [Node() for _ in range(1_000)]

            assert paused
            assert gc.isenabled()
            assert gc.get_freeze_count() >= len(kept)
        finally:
            gc.unfreeze()

    def test_a_failed_start_up_turns_the_collector_back_on(self) -> None:
        try:
            with pytest.raises(ImportError), gc_tuning.start_up_uncollected():
                raise ImportError("no module named nowhere")

            assert gc.isenabled()
        finally:
            gc.unfreeze()

    def test_a_collector_turned_off_before_stays_off(self) -> None:
        gc.disable()
        try:
            with gc_tuning.start_up_uncollected():
                pass

            assert not gc.isenabled()
        finally:
            gc.enable()
            gc.unfreeze()

    def test_the_exit_freezes_once_however_many_commands_ran(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        at_exit = ExitCallbacks()
        monkeypatch.setattr(gc_tuning, "atexit", at_exit)

        gc_tuning.no_collection_at_exit()
        gc_tuning.no_collection_at_exit()

        assert at_exit.callbacks == [gc.freeze]


class ExitCallbacks:
    """What `atexit` would call, in order (the real one has no public list)."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], object]] = []

    def register(self, callback: Callable[[], object]) -> None:
        self.callbacks.append(callback)

    def unregister(self, callback: Callable[[], object]) -> None:
        self.callbacks = [c for c in self.callbacks if c != callback]
