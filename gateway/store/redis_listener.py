"""The Redis store's pub/sub side: invalidations in, settlement wake-ups out.

One :class:`RedisListener` per store holds the one pub/sub connection of that
store (started lazily, from a running loop, on the first ``subscribe`` or wait),
reconnecting by itself with a capped backoff. It delivers two channels (see
the key table in :mod:`gateway.store.redis`):

- ``settled``: wakes the futures that ``RedisStore.wait_settled`` registered
  for a sandbox (:meth:`RedisListener.waiter`);
- ``invalidate``: calls every subscribed ``Invalidation`` with the session or
  sandbox ID another replica invalidated (this instance's own invalidations are
  delivered synchronously by :meth:`RedisListener.notify`, before the call that
  made them returns).

After a reconnect every waiter is woken to re-read its record, and every
subscriber gets ``INVALIDATE_ALL``: messages sent while disconnected are lost.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from gateway.errors import StoreUnavailable
from gateway.store.base import INVALIDATE_ALL, Invalidation
from gateway.store.redis_scripts import RedisKeys

log = logging.getLogger(__name__)

_CHANNELS = 2  # settled + invalidate: a subscription is complete when both are confirmed
_LISTEN_POLL = 1.0  # the listener wakes this often to run redis-py's health check
_MIN_BACKOFF, _MAX_BACKOFF = 0.05, 1.0

Waiter = asyncio.Future[dict[str, Any] | None]
"""Resolved with a ``settled`` message for its sandbox, or None after a resubscription (re-read)."""


class RedisListener:
    """Pub/sub for one ``RedisStore``: ``origin`` tells this instance's invalidations from others'.

    ``on_remote_release`` is called with a sandbox ID another replica released
    (the store drops its local stream count for it), before the subscribers.
    """

    def __init__(self, redis: Redis, keys: RedisKeys, origin: str, *, connect_timeout: float,
                 on_remote_release: Callable[[str], None]) -> None:
        self._redis = redis
        self._keys = keys
        self._origin = origin
        self._on_remote_release = on_remote_release
        self.subscribe_timeout = connect_timeout + 2 * _MAX_BACKOFF  # the listener retries at least this often
        self._callbacks: list[Invalidation] = []
        self._waiters: dict[str, set[Waiter]] = {}
        self._parked: collections.Counter[str] = collections.Counter()  # waiters past their read: parked()
        self._subscribed = asyncio.Event()
        self._was_subscribed = False
        self._stopping = asyncio.Event()
        self._error: Exception | None = None  # why the listener last failed to (re)subscribe
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def is_subscribed(self) -> bool:
        return self._subscribed.is_set()

    def subscribe(self, callback: Invalidation) -> None:
        self._callbacks.append(callback)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the listener starts on the first call made from one
        self.start()

    def start(self, *, force: bool = False) -> None:
        """Start listening (from a running loop); without ``force`` only once someone subscribed."""
        if self._task is None and not self._closed and (force or self._callbacks):
            self._task = asyncio.get_running_loop().create_task(self._listen(), name="redis-store-listener")

    async def subscribed(self, timeout: float) -> None:
        """Wait until subscribed (starting if needed); ``StoreUnavailable`` past ``timeout``."""
        if self._closed:
            raise StoreUnavailable("the session store was closed")
        self.start(force=True)
        if self._subscribed.is_set():
            return
        try:
            async with asyncio.timeout(timeout):
                await self._subscribed.wait()
        except TimeoutError:
            raise StoreUnavailable("the session store (redis) could not subscribe to its channels; retry shortly",
                                   retry_after=2.0) from self._error

    @contextmanager
    def waiter(self, sandbox_id: str) -> Iterator[Waiter]:
        """A future woken by the next ``settled`` message for ``sandbox_id`` (or a resubscription)."""
        future: Waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(sandbox_id, set()).add(future)
        try:
            yield future
        finally:
            waiters = self._waiters.get(sandbox_id)
            if waiters is not None:
                waiters.discard(future)
                if not waiters:
                    del self._waiters[sandbox_id]

    @contextmanager
    def parked(self, sandbox_id: str) -> Iterator[None]:
        """Counted in ``parked_count`` (the store's ``waiting``) while a waiter that has read the record waits."""
        self._parked[sandbox_id] += 1
        try:
            yield
        finally:
            self._parked[sandbox_id] -= 1
            if not self._parked[sandbox_id]:
                del self._parked[sandbox_id]

    def parked_count(self, sandbox_id: str) -> int:
        return self._parked[sandbox_id]

    def notify(self, key: str) -> None:
        """Deliver an invalidation made by this instance to its own subscribers, synchronously."""
        for callback in self._callbacks:
            try:
                callback(key)
            except Exception:
                log.exception("invalidation callback failed for %r", key)

    async def pause(self, seconds: float) -> None:
        """Sleep, but return at once when the listener closes (the store's heartbeat uses it too)."""
        try:
            async with asyncio.timeout(seconds):
                await self._stopping.wait()
        except TimeoutError:
            pass

    async def close(self) -> None:
        self._closed = True
        self._stopping.set()
        # Cancelled until done: on Python 3.11, asyncio.wait_for (inside redis-py) can swallow a
        # cancellation that races with a reply; the loop also stops on ``_closed``.
        pending = {self._task} if self._task is not None else set()
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.1)
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(StoreUnavailable("the session store was closed"))
        self._waiters.clear()

    async def _listen(self) -> None:
        """Deliver pub/sub messages for as long as the store is open, resubscribing after failures."""
        delay, failing = _MIN_BACKOFF, False
        while not self._closed:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(self._keys.settled, self._keys.invalidate)
                while not self._closed:
                    message = await pubsub.get_message(timeout=_LISTEN_POLL)
                    if message is not None:
                        self._on_message(message)
                    if failing and self._subscribed.is_set():
                        log.info("redis pub/sub listener resubscribed")
                        delay, failing, self._error = _MIN_BACKOFF, False, None
            except redis_errors.RedisError as exc:
                if not failing:
                    log.warning("redis pub/sub listener lost its connection (%s); reconnecting", type(exc).__name__)
                failing, self._error = True, exc
            except Exception as exc:  # a bug must not silence invalidations for the life of the process
                log.exception("redis pub/sub listener failed; restarting it")
                failing, self._error = True, exc
            finally:
                self._subscribed.clear()
                await pubsub.aclose()
            await self.pause(delay)
            delay = min(delay * 2, _MAX_BACKOFF)

    def _on_message(self, message: dict[str, Any]) -> None:
        kind, channel, data = message["type"], message["channel"], message["data"]
        if kind == "subscribe":
            if data == _CHANNELS:
                self._on_subscribed()
            return
        if kind != "message":
            return
        try:
            payload = json.loads(data)
            if channel == self._keys.settled:
                self._on_settled(payload)
            elif channel == self._keys.invalidate:
                self._on_invalidate(payload)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed message on %s", channel)

    def _on_subscribed(self) -> None:
        """(Re)subscribed to both channels: wake every waiter to re-read its record."""
        if self._was_subscribed:
            # Invalidations published while we were away are lost: drop every cached route.
            for callback in list(self._callbacks):
                callback(INVALIDATE_ALL)
        self._was_subscribed = True
        self._subscribed.set()
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def _on_settled(self, payload: dict[str, Any]) -> None:
        """One sandbox ("id"), or a reaper's batch ("ids": one message for many, same gen and state)."""
        for sandbox_id in payload["ids"] if "ids" in payload else (payload["id"],):
            for future in self._waiters.get(sandbox_id, ()):
                if not future.done():
                    future.set_result({**payload, "id": sandbox_id})

    def _on_invalidate(self, payload: list[Any]) -> None:
        origin, what, key, *more = payload
        if origin == self._origin:
            return  # delivered synchronously when this instance made it
        if what == "sandboxes":  # a reaper's batch: [origin, "sandboxes", [sandbox IDs], [session IDs]]
            for sandbox_id in key:
                self._on_remote_release(sandbox_id)
                self.notify(sandbox_id)
            for session_id in more[0] if more else ():
                self.notify(session_id)
            return
        if what == "sandbox":
            self._on_remote_release(key)
        self.notify(key)
