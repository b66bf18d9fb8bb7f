"""Misbehaviour for the fake apiserver, switchable per test: what a real cluster does under load,
during an upgrade or behind a flaky network, injected in front of the request pipeline.

``server.faults.inject(status=429, retry_after=1, times=3, method="POST")`` answers the next three
matching requests with a 429 ``Status`` and ``Retry-After: 1`` (API Priority and Fairness); ``status=
500``/``503`` as an apiserver that is starting or overloaded; ``stall=2`` holds a request that long
before it is answered (``math.inf``: never, until the client goes away); ``drop=True`` cuts the TCP
connection without an answer (``drop_after=True``: after the request was carried out, so a create is
stored though its client never hears so). ``watch=True`` limits a fault to watch requests (a non-200 watch),
``watch=False`` to everything else; ``method`` and ``path`` (a substring) narrow it further;
``times=None`` keeps it until ``clear()``; ``fraction`` hits that share of matching requests (a
seeded random, so a run repeats). ``server.restart(down_for)`` is an apiserver restart: every watch
is cut, the watch cache is lost (older resourceVersions answer 410) and, for ``down_for`` seconds,
every connection is dropped. ``server.api.deletion_delay[plural] = seconds`` holds each deletion of that
resource (``pods`` too: a pod's grace period) with a finalizer for that long; ``server.api.gc_delay``
runs the garbage collector that long after an owner goes.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

_REASONS = {429: "TooManyRequests", 500: "InternalError", 502: "BadGateway", 503: "ServiceUnavailable",
            504: "Timeout"}


@dataclass
class Fault:
    status: int = 0
    retry_after: float | None = None
    stall: float = 0.0
    drop: bool = False
    drop_after: bool = False
    times: int | None = 1
    method: str | None = None
    watch: bool | None = None
    path: str | None = None
    fraction: float = 1.0
    hits: int = field(default=0, init=False)

    def matches(self, request: web.Request, is_watch: bool) -> bool:
        return ((self.method is None or request.method == self.method)
                and (self.watch is None or self.watch == is_watch)
                and (self.path is None or self.path in request.path))


class Faults:
    """The injected faults of one fake apiserver, consulted by its middleware for every request."""

    def __init__(self, seed: int = 30) -> None:
        self._rules: list[Fault] = []
        self._rng = random.Random(seed)
        self._down_until = 0.0
        self.served: Counter[str] = Counter()  # what the faults answered: "429", "500", "stall", "drop"

    def inject(self, **options: object) -> Fault:
        fault = Fault(**options)  # type: ignore[arg-type]
        self._rules.append(fault)
        return fault

    def clear(self) -> None:
        self._rules.clear()
        self._down_until = 0.0

    def down(self, seconds: float) -> None:
        """Drop every connection for ``seconds`` (an apiserver that is not there)."""
        self._down_until = asyncio.get_running_loop().time() + seconds

    def take(self, request: web.Request) -> Fault | None:
        if asyncio.get_running_loop().time() < self._down_until:
            return Fault(drop=True)
        is_watch = request.query.get("watch", "").lower() in ("true", "1")
        for fault in self._rules:
            if not fault.matches(request, is_watch) or self._rng.random() >= fault.fraction:
                continue
            fault.hits += 1
            if fault.times is not None and fault.hits >= fault.times:
                self._rules.remove(fault)
            return fault
        return None

    def cut(self, request: web.Request) -> None:
        self.served["drop"] += 1
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError  # nothing is written: the client sees the connection reset

    async def answer(self, request: web.Request, fault: Fault) -> web.StreamResponse | None:
        """The fault's answer, or None when the request goes on to the real handler (a stall only)."""
        if fault.stall:
            self.served["stall"] += 1
            await asyncio.sleep(fault.stall if math.isfinite(fault.stall) else 1e9)
        if fault.drop:
            self.cut(request)
        if not fault.status:
            return None
        self.served[str(fault.status)] += 1
        reason = _REASONS.get(fault.status, "InternalError")
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": reason,
                "message": f"fakekube: injected {fault.status}", "code": fault.status}
        headers = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
        if fault.status == 429 and fault.retry_after is not None:
            body["details"] = {"retryAfterSeconds": math.ceil(fault.retry_after)}
        return web.Response(status=fault.status, text=json.dumps(body), content_type="application/json",
                            headers=headers)
