"""Latency and error metrics for any ``SessionStore``, in one wrapper.

Wrapping at the seam keeps timing code out of both stores and out of the
router. ``wait_settled`` is passed through untimed: it waits for another
replica's sandbox creation, which is provisioning time, not store latency.
What it reports into is a :class:`StoreCalls` (``gateway.metrics.Metrics``, wired by
``gateway.app``), so the store package does not import the metrics.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway.errors import StoreUnavailable
from gateway.store.base import SessionStore

_UNTIMED = frozenset({"wait_settled", "close", "subscribe"})


class StoreCalls(Protocol):
    def store_call(self, op: str) -> tuple[Callable[[float], None], Callable[[], None]]:
        """For store method ``op``: what observes a call's seconds, and what counts a failure."""


class InstrumentedStore:
    def __init__(self, inner: SessionStore, metrics: StoreCalls) -> None:
        self.inner = inner
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in _UNTIMED or not inspect.iscoroutinefunction(attr):
            return attr
        timed = _timed(attr, *self._metrics.store_call(name))
        setattr(self, name, timed)  # resolved once per method, then a plain attribute
        return timed


def _timed(call: Callable[..., Awaitable[Any]], observe: Callable[[float], None],
           failed: Callable[[], None]) -> Callable[..., Awaitable[Any]]:
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await call(*args, **kwargs)
        except StoreUnavailable:
            failed()
            raise
        finally:
            observe(time.perf_counter() - started)

    return timed
