"""One shared watch per (namespace, kind, selector): an informer's shape.

A watch holds one of the API client's pooled connections for as long as it is open. One per
sandbox in flight (the old shape) exhausted the pool at 100 concurrent provisions and stalled
every other call; here each :class:`Informer` lists once, then watches from the list's
``resourceVersion`` with ``allowWatchBookmarks`` (so a resumed watch rarely falls out of the watch
cache), relists on 410 Gone, and backs off with jitter on errors and non-200 answers. Every waiter
(provisioning, waking, suspending) and lost-sandbox detection read the one cache and its events,
so API connections are bounded by namespaces x kinds, not by sandboxes in flight.

A waiter names the object by its ``uid`` (from the create, patch or read it holds): a state of
another object of the same name (an older incarnation still in the cache, or a newer one) is never
taken for it, and a DELETED of that uid, or another uid under the name, means it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gateway.errors import KubeApiError
from gateway.providers.kubernetes_api import Kind, WatchExpired, translated, watch_events
from gateway.providers.kubernetes_calls import Calls, retry_after

log = logging.getLogger(__name__)

Obj = dict[str, Any]
#: (event type, object): ADDED, MODIFIED, DELETED (a relist makes them up for what changed meanwhile).
Listener = Callable[[str, Obj], None]
#: Server-side timeout of one watch request; each is given a random share more, so watches restart apart.
WATCH_SECONDS = 240


def newer_or_same(a: Obj, b: Obj) -> bool:
    """Whether state ``a`` is at least as recent as ``b`` (resourceVersions compared as the integers
    etcd makes them; unknown forms count as newer, so nothing waits on a guess)."""
    try:
        return int(a["metadata"]["resourceVersion"]) >= int(b["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return True


@dataclass(eq=False)
class _Waiter:
    uid: str
    since: Obj
    done: Callable[[Obj], bool]
    future: asyncio.Future[Obj | None]

    def offer(self, kind: str, obj: Obj) -> None:
        if self.future.done():
            return
        meta = obj["metadata"]
        if meta.get("uid") != self.uid:
            if kind != "DELETED" and newer_or_same(obj, self.since):
                self.future.set_result(None)  # the name holds another object now: ours is gone
            return
        if kind == "DELETED":
            self.future.set_result(None)
        elif newer_or_same(obj, self.since) and self.done(obj):
            self.future.set_result(obj)


class Informer:
    """The list+watch of one (namespace, kind, label selector), its cache, waiters and listeners."""

    def __init__(self, api: client.CustomObjectsApi, calls: Calls, kind: Kind, namespace: str,
                 selector: str | None) -> None:
        self._api, self._calls = api, calls
        self.kind, self.namespace, self.selector = kind, namespace, selector
        self.cache: dict[str, Obj] = {}
        self._version: str | None = None
        self._waiters: dict[str, set[_Waiter]] = {}
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()
        self.synced = asyncio.Event()

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"watch {self.kind.plural} in {self.namespace}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait(self, obj: Obj, done: Callable[[Obj], bool]) -> Obj | None:
        """The first state of ``obj`` (this one, the cache's, then events) that is ``done``; None once
        it is deleted. Unbounded: the caller bounds it with its deadline."""
        if done(obj):
            return obj
        meta = obj["metadata"]
        waiter = _Waiter(meta["uid"], obj, done, asyncio.get_running_loop().create_future())
        cached = self.cache.get(meta["name"])
        if cached is not None:
            waiter.offer("MODIFIED", cached)
        elif self.synced.is_set() and self._version is not None and newer_or_same(
                {"metadata": {"resourceVersion": self._version}}, obj):
            waiter.future.set_result(None)  # the cache has seen past this state and no longer holds it
        if waiter.future.done():
            return waiter.future.result()
        self._waiters.setdefault(meta["name"], set()).add(waiter)
        try:
            return await waiter.future
        finally:
            waiting = self._waiters.get(meta["name"])
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._waiters[meta["name"]]

    # the loop ----------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        attempt = 0
        while True:
            reason, at_least = "closed", 0.0
            try:
                if self._version is None:
                    await self._relist()
                async for kind, obj in self._watch():
                    attempt = 0
                    self._apply(kind, obj)
            except asyncio.CancelledError:
                raise
            except WatchExpired:
                self._version, reason = None, "expired"
            except KubeApiError as exc:
                reason = "error"
                cause = exc.__cause__
                at_least = (retry_after(cause) or 0.0) if isinstance(cause, ApiException) else 0.0
                log.warning("%s; retrying", exc.message)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                reason = "dropped"
                log.info("watch on %s in %s dropped: %s", self.kind.plural, self.namespace, exc)
            except Exception:  # never let lost-sandbox detection stop silently
                reason = "error"
                log.exception("watch on %s in %s failed", self.kind.plural, self.namespace)
            self._calls.observer.watch_restarted(reason)
            if reason in ("error", "dropped"):
                await asyncio.sleep(max(at_least, self._calls.pause(attempt)))  # a 429's Retry-After too
                attempt += 1

    async def _relist(self) -> None:
        kind = self.kind
        listing = await self._calls.call(
            "list", kind.plural, f"listing {kind.plural} in {self.namespace}",
            lambda timeout: self._api.list_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural, label_selector=self.selector or "",
                _request_timeout=timeout),
            deadline=self._calls.deadline())
        items = {item["metadata"]["name"]: item for item in listing.get("items", ())}
        self._version = listing["metadata"].get("resourceVersion")
        gone = [obj for name, obj in self.cache.items() if name not in items]
        for obj in gone:
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": self._version}}
            self._apply("DELETED", obj)
        for name, item in items.items():
            self._apply("MODIFIED" if name in self.cache else "ADDED", item)
        self.synced.set()

    async def _watch(self) -> Any:
        kind = self.kind
        seconds = WATCH_SECONDS + self._rng.randint(0, WATCH_SECONDS // 4)
        timeout = aiohttp.ClientTimeout(sock_connect=self._calls.connect_timeout, sock_read=seconds + 30)
        with translated(f"watching {kind.plural} in {self.namespace}"):
            async for event in watch_events(self._api, kind, self.namespace, label_selector=self.selector or "",
                                            resource_version=self._version, allow_watch_bookmarks=True,
                                            timeout_seconds=seconds, _request_timeout=timeout,
                                            observer=self._calls.observer):
                obj = event["object"]
                self._version = obj["metadata"].get("resourceVersion", self._version)
                if event["type"] != "BOOKMARK":
                    yield event["type"], obj

    def _apply(self, kind: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.cache.pop(name, None)
        else:
            self.cache[name] = obj
        for waiter in list(self._waiters.get(name, ())):
            waiter.offer(kind, obj)
        for listener in self._listeners:
            listener(kind, obj)
