"""A connection pool that serves its waiters in order: the store's ``BlockingConnectionPool``s.

redis-py's ``BlockingConnectionPool`` (8.1) waits on an ``asyncio.Condition``: a release notifies one
waiter, but that waiter must take the condition's lock again before it looks, and a caller arriving
in between (the task that just released, asking for its next command) finds the connection free and
takes it; the notified waiter goes back to the end of the queue. Under a burst (a wake storm's held
requests, each reading the store again) the same few tasks keep the connections and the others wait
out ``pool_timeout`` (``ConnectionError('No connection available')``, a 503 "cannot be reached"), a
lease renewal among them (the lease is lost). On Python 3.11 a waiter cancelled just after it was
notified also drops the notification: a connection stays free while others sleep.

Here a released connection goes to the longest waiter directly (no barging: nobody takes a connection
while someone waits), and a waiter that gives up after it was handed one passes it on. Calls made
``with first():`` (lease renewals: a late one loses the lease, and a takeover means a second resume)
go to the front of the queue: they never wait behind request traffic, only for the next release.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError  # noqa: A004  (redis-py's, not the builtin)

__all__ = ["FairWaits", "FairBlockingPool", "first"]

_FIRST: ContextVar[bool] = ContextVar("redis_pool_first", default=False)


@contextlib.contextmanager
def first() -> Iterator[None]:
    """The store calls made inside (in this task) take the next free connection, ahead of every waiter."""
    token = _FIRST.set(True)
    try:
        yield
    finally:
        _FIRST.reset(token)


class FairWaits:
    """Mixin before a ``BlockingConnectionPool``: first come, first served, cancellation-safe."""

    _waiting: deque[asyncio.Future[AbstractConnection]]

    def _queue(self) -> deque[asyncio.Future[AbstractConnection]]:
        try:
            return self._waiting
        except AttributeError:  # set lazily: the Sentinel pool's __init__ does not reach ours
            self._waiting = deque()
            return self._waiting

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> AbstractConnection:
        connection = await self._checkout()
        try:
            await self.ensure_connection(connection)  # type: ignore[attr-defined]
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: AbstractConnection) -> None:
        await ConnectionPool.release(self, connection)  # type: ignore[arg-type]  (in use -> available)
        self._hand_out()

    def waiting(self) -> int:
        """How many callers wait for a connection now (for tests and debugging)."""
        return sum(not fut.done() for fut in self._queue())

    async def _checkout(self) -> AbstractConnection:
        waiting = self._queue()
        if not waiting and self.can_get_connection():  # type: ignore[attr-defined]
            return self.get_available_connection()  # type: ignore[attr-defined,no-any-return]
        fut: asyncio.Future[AbstractConnection] = asyncio.get_running_loop().create_future()
        if _FIRST.get():
            waiting.appendleft(fut)
        else:
            waiting.append(fut)
        try:
            async with asyncio.timeout(self.timeout):  # type: ignore[attr-defined]
                return await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self._pass_on(fut.result())  # handed one just as we gave up
            with contextlib.suppress(ValueError):
                waiting.remove(fut)
            if isinstance(exc, TimeoutError):
                raise ConnectionError("No connection available.") from exc
            raise

    def _hand_out(self) -> None:
        waiting = self._queue()
        while waiting and self.can_get_connection():  # type: ignore[attr-defined]
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(self.get_available_connection())  # type: ignore[attr-defined]

    def _pass_on(self, connection: AbstractConnection) -> None:
        """A connection checked out but never used: to the next waiter, else back to the free list."""
        waiting = self._queue()
        while waiting:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(connection)
                return
        self._in_use_connections.remove(connection)  # type: ignore[attr-defined]
        self._available_connections.append(connection)  # type: ignore[attr-defined]


class FairBlockingPool(FairWaits, BlockingConnectionPool):
    """The plain URL's pool."""
