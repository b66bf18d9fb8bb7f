"""Redis errors as the store's callers see them: ``StoreUnavailable`` (503 with a ``Retry-After``),
classified by the error's type, never its message, in this one place for every Redis call."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from redis import exceptions as redis_errors
from redis.asyncio.sentinel import MasterNotFoundError

from gateway.errors import StoreUnavailable
from gateway.store.redis_connect import PrimaryUnreachable

__all__ = ["translated", "unavailable"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


def translated(action: str) -> Callable[[Callable[_P, Awaitable[_T]]], Callable[_P, Awaitable[_T]]]:
    """Turn every redis error raised by the wrapped call into ``StoreUnavailable``."""

    def decorate(method: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
        @functools.wraps(method)
        async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
            try:
                return await method(*args, **kwargs)
            except redis_errors.RedisError as exc:
                raise unavailable(action, exc) from exc

        return wrapper

    return decorate


def unavailable(action: str, exc: redis_errors.RedisError) -> StoreUnavailable:
    """The ``StoreUnavailable`` for a redis error, classified by type (never by message text)."""
    if isinstance(exc, MasterNotFoundError):
        # Sentinel knows no healthy primary: a failover is under way, and takes seconds.
        reason, retry_after = "it has no primary (a Sentinel failover is under way)", 1.0
    elif isinstance(exc, PrimaryUnreachable):
        # The primary Sentinel names does not answer: the seconds before Sentinel sees it down.
        reason, retry_after = "its primary cannot be reached (a Sentinel failover may be under way)", 1.0
    elif isinstance(exc, redis_errors.BusyLoadingError):
        reason, retry_after = "it is loading its dataset", 2.0
    elif isinstance(exc, redis_errors.ConnectionError):
        reason, retry_after = "it cannot be reached", 5.0
    elif isinstance(exc, redis_errors.TimeoutError):
        reason, retry_after = "it did not answer in time", 2.0
    elif isinstance(exc, redis_errors.ReadOnlyError):
        reason, retry_after = "it is a read-only replica", 5.0
    elif isinstance(exc, redis_errors.OutOfMemoryError):
        reason, retry_after = "it is out of memory", 30.0
    else:
        reason, retry_after = f"it refused the command ({type(exc).__name__})", 5.0
    return StoreUnavailable(f"the session store (redis) could not {action}: {reason}; retry shortly",
                            retry_after=retry_after)
