"""Translation of redis-py errors into port errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import BusyLoadingError, ReadOnlyError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eco_router.application.errors import TransientError

TRANSIENT_REDIS_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    TryAgainError,
    ConnectionError,
    TimeoutError,
    OSError,
)


@contextmanager
def transient_errors(
    what: str, error_type: type[TransientError] = TransientError
) -> Iterator[None]:
    """Re-raise unreachable-server errors as `error_type`, naming the operation."""
    try:
        yield
    except TRANSIENT_REDIS_ERRORS as error:
        raise error_type(f"{what}: {type(error).__name__}: {error}") from error
