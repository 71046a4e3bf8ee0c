"""Garbage-collector settings: for a long-running server process, and for the start and the
exit of every command."""

from __future__ import annotations

import atexit
import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

# Young collections every 5,000 allocations instead of 700: each is cheap, but with a thousand
# streams open the default rate promotes objects into full collections far more often.
GEN0_THRESHOLD = 5_000
# Collections at least this long are logged at DEBUG (the pauses the event loop takes).
LOGGED_PAUSE_MS = 1.0
# How often a full collection looks at every object again, frozen ones included.
FULL_SWEEP_S = 600.0


def settle_garbage_collector() -> None:
    """Call once start-up is done: modules, the app and the container are never garbage.

    Frozen, they are left out of every later collection. With 1,000 SSE clients a full
    collection over them paused the event loop for ~150 ms every 10-12 s (the p99 of event
    delivery); frozen and with rarer young collections, the p99 stays at a few milliseconds.

    Every collection of the middle or oldest generation then freezes what survived it, so
    a full collection only looks at objects created since: with thousands of streams open,
    one over all of them paused the loop for 0.5 s as the connections opened. Garbage cycles
    among frozen objects (streams that ended after they were frozen) wait for the sweep every
    `FULL_SWEEP_S`, which unfreezes everything first.
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    if _collections not in gc.callbacks:
        gc.callbacks.append(_collections)


@contextmanager
def start_up_uncollected() -> Iterator[None]:
    """Run a command's start-up imports with the cyclic collector paused, then freeze what
    they made.

    The modules, classes and validators they make (some 45,000 objects for `publish`) live
    as long as the process: the collections that ran while they loaded freed a few hundred
    objects for about a tenth of a short command's CPU, and frozen, these objects are left
    out of every later collection. The collector is on again once they are loaded.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def no_collection_at_exit() -> None:
    """Freeze every object when the interpreter exits, before its last full collections.

    Those walk every object the process made only for the memory to go back to the system
    with the process: about a fifth of a short command's CPU. Objects are still finalized
    as the modules are cleared; only those in reference cycles are not, which Python does
    not promise at exit anyway.
    """
    # Once, however many times a process runs a command (the tests run many).
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


class _State:
    started = 0.0
    last_sweep = time.monotonic()


def _collections(phase: str, info: dict[str, int]) -> None:
    now = time.perf_counter()
    full = info["generation"] == 2
    if phase == "start":
        _State.started = now
        if full and time.monotonic() - _State.last_sweep >= FULL_SWEEP_S:
            _State.last_sweep = time.monotonic()
            gc.unfreeze()
        return
    if info["generation"] >= 1:
        gc.freeze()
    pause_ms = (now - _State.started) * 1000
    if pause_ms >= LOGGED_PAUSE_MS and log.isEnabledFor(logging.DEBUG):
        log.debug(
            "gc pause: generation %d %.1f ms, %d collected",
            info["generation"],
            pause_ms,
            info["collected"],
        )
