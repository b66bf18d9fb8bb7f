"""The fake etcd: objects in their storage version, one global resourceVersion counter, a bounded
event history, and the fan-out of change events to watch streams and in-process listeners.

Everything here is synchronous: in one asyncio thread a mutation and its event fan-out are atomic,
so a watch registered in the same step as its history replay can never miss or duplicate an event.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (resource key, namespace, name)


@dataclass(frozen=True)
class Event:
    """One change. `obj` and `prev` are storage-version snapshots: never mutate them."""

    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    resource: str
    obj: Obj
    prev: Obj | None

    @property
    def namespace(self) -> str:
        return self.obj["metadata"].get("namespace", "")

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]


DROP = object()  # queue sentinel: the stream is cut abruptly
END = object()  # queue sentinel: the stream ends cleanly


@dataclass(frozen=True)
class Bookmark:
    """Queue item: send a BOOKMARK; every event up to `rv` was queued before it."""

    rv: int


@dataclass(eq=False)
class Watcher:
    resource: str
    namespace: str | None
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def wants(self, event: Event) -> bool:
        return event.resource == self.resource and (self.namespace is None or event.namespace == self.namespace)


class Store:
    def __init__(self, history_size: int = 1000):
        self._objects: dict[Key, Obj] = {}
        self._rv = 0
        self._history: deque[Event] = deque()
        self._history_size = history_size
        self._floor = 0  # every event with rv > _floor is in _history
        self._watchers: set[Watcher] = set()
        self._listeners: list[Callable[[Event], None]] = []
        self._watch_listeners: list[Callable[[], None]] = []

    # --- reads ------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def oldest_resource_version(self) -> int:
        """A watch may start from any resourceVersion >= this one."""
        return self._floor

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        obj = self._objects.get((resource, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def items(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """Snapshots sorted by (namespace, name), as etcd's key order."""
        keys = sorted(k for k in self._objects if k[0] == resource and (namespace is None or k[1] == namespace))
        return [copy.deepcopy(self._objects[k]) for k in keys]

    def find_by_uid(self, uid: str) -> Obj | None:
        for obj in self._objects.values():
            if obj["metadata"].get("uid") == uid:
                return copy.deepcopy(obj)
        return None

    def events_since(self, rv: int) -> list[Event] | None:
        """Events after `rv`, or None if some of them were already forgotten (410 Expired)."""
        if rv < self._floor:
            return None
        return [e for e in self._history if e.rv > rv]

    # --- writes -----------------------------------------------------------------------------

    def put(self, resource: str, obj: Obj) -> Event:
        """Create or replace `obj`, stamping a new resourceVersion; returns the event."""
        meta = obj["metadata"]
        key = (resource, meta.get("namespace", ""), meta["name"])
        prev = self._objects.get(key)
        self._rv += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key] = stored
        return self._emit(Event(self._rv, "MODIFIED" if prev else "ADDED", resource, stored, prev))

    def remove(self, resource: str, namespace: str, name: str) -> Event | None:
        prev = self._objects.pop((resource, namespace, name), None)
        if prev is None:
            return None
        self._rv += 1
        gone = copy.deepcopy(prev)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        return self._emit(Event(self._rv, "DELETED", resource, gone, prev))

    def _emit(self, event: Event) -> Event:
        self._history.append(event)
        while len(self._history) > self._history_size:
            self._floor = self._history.popleft().rv
        for watcher in list(self._watchers):
            if watcher.wants(event):
                watcher.queue.put_nowait(event)
        for listener in list(self._listeners):
            listener(event)
        return event

    # --- watch plumbing ---------------------------------------------------------------------

    def watch(self, resource: str, namespace: str | None, since: int | None) -> tuple[Watcher, list[Event]] | None:
        """Register a watcher; returns it with the history to replay first (events after `since`),
        or None when `since` is older than the history (the caller answers 410 Expired)."""
        backlog: list[Event] = []
        if since is not None:
            past = self.events_since(since)
            if past is None:
                return None
            backlog = [e for e in past if e.resource == resource and (namespace is None or e.namespace == namespace)]
        watcher = Watcher(resource, namespace)
        self._watchers.add(watcher)
        self._watchers_changed()
        return watcher, backlog

    def unwatch(self, watcher: Watcher) -> None:
        if watcher in self._watchers:
            self._watchers.discard(watcher)
            self._watchers_changed()

    def on_watchers_changed(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` whenever a watch opens or closes; returns the unsubscriber."""
        self._watch_listeners.append(callback)
        return lambda: self._watch_listeners.remove(callback) if callback in self._watch_listeners else None

    def _watchers_changed(self) -> None:
        for callback in list(self._watch_listeners):
            callback()

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    def end_watches(self, abrupt: bool) -> int:
        """Close every open watch stream (abruptly = cut the connection mid-stream)."""
        watchers = list(self._watchers)
        for watcher in watchers:
            watcher.queue.put_nowait(DROP if abrupt else END)
            self._watchers.discard(watcher)
        if watchers:
            self._watchers_changed()
        return len(watchers)

    def bookmark_watches(self) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(Bookmark(self._rv))

    def compact(self) -> None:
        """Forget the whole history: the next watch from an older resourceVersion gets 410."""
        self._history.clear()
        self._floor = self._rv

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call `listener(event)` synchronously after every change; returns the unsubscriber."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None
