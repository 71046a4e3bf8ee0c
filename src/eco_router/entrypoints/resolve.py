"""Awaiting what dependency-injector returns, whichever shape it has."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def resolve(value: T | Awaitable[T]) -> T:
    """Providers downstream of an async Resource return awaitables, others plain values."""
    if inspect.isawaitable(value):
        return await value
    return value
