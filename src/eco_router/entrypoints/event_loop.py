"""Which asyncio event loop the processes run on (`EVENT_ROUTER_EVENT_LOOP`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")
EventLoopChoice = Literal["auto", "uvloop", "asyncio"]


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop (`auto`: where it is installed), else None for asyncio's own."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ValueError(
                "uvloop is not installed (pip install uvloop, or use auto or asyncio)"
            ) from None
        return None
    return uvloop.new_event_loop


def uvicorn_loop(choice: EventLoopChoice) -> str:
    """uvicorn's `loop` option for the same choice."""
    return "asyncio" if loop_factory(choice) is None else "uvloop"


def run(main: Coroutine[Any, Any, T], choice: EventLoopChoice) -> T:
    """`asyncio.run(main)` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
