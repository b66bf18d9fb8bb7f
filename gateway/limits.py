"""Per-org admission limits: request rate (token bucket) and concurrent streams.

Limits are per replica: N replicas admit up to N times the configured rate,
which is what a limit meant to stop one tenant from starving the others on a
replica needs, with no store round trip on the hot path. Personal accounts
(no org) are limited per user under the key ``user:<id>``.

Over a limit the caller gets 429 with ``Retry-After`` (when a token will be
available again), and nothing is forwarded or created.

Streams are admitted where a 429 is still possible: a request that declares
itself a stream (a WebSocket upgrade, or ``Accept: text/event-stream`` as every
EventSource sends) takes a slot before it is forwarded, or gets 429. A response
that turns out to be a stream without having said so (an undeclared SSE body, a
request still open after ``LONG_REQUEST_AFTER``) cannot be refused any more: it
takes a slot regardless (``force``), so it counts against the org's next streams.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.errors import CapacityExceeded
from routing import Identity

if TYPE_CHECKING:
    from gateway.model import Owner
    from gateway.settings import Settings

_MAX_TRACKED = 100_000  # buckets kept; the least recently refilled go first


def limit_key(identity: Identity | Owner) -> str:
    """What limits count by: the org, else the user (an identity, or a sandbox's owner for a request
    addressed by an access token, which carries no identity)."""
    return identity.org_id if identity.org_id is not None else f"user:{identity.user_id}"


class OrgLimits:
    """``rate`` requests/s with bursts of ``burst``; ``max_streams`` open streams. None = unlimited."""

    def __init__(self, *, rate: float | None = None, burst: int | None = None, max_streams: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._burst = float(burst if burst is not None else max(1, math.ceil(rate or 1)))
        self._max_streams = max_streams
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, updated)
        self._streams: dict[str, int] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> OrgLimits:
        return cls(rate=settings.org_rate_limit, burst=settings.org_rate_burst,
                   max_streams=settings.max_streams_per_org)

    @property
    def active(self) -> bool:
        return self._rate is not None or self._max_streams is not None

    @property
    def caps_streams(self) -> bool:
        return self._max_streams is not None

    def open_streams(self, key: str) -> int:
        return self._streams.get(key, 0)

    def admit(self, key: str) -> None:
        """Take one request token for ``key`` or raise ``CapacityExceeded``."""
        if self._rate is None:
            return
        now = self._clock()
        tokens, updated = self._buckets.pop(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - updated) * self._rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            raise CapacityExceeded(
                f"request rate limit for {key!r} reached ({self._rate:g}/s, burst {self._burst:g}); slow down",
                scope="org_rate", retry_after=(1.0 - tokens) / self._rate)
        if len(self._buckets) >= _MAX_TRACKED:
            self._buckets.pop(next(iter(self._buckets)))
        self._buckets[key] = (tokens - 1.0, now)  # re-inserted last: dict order is recency

    def open_stream(self, key: str, *, force: bool = False) -> None:
        """Count a new stream for ``key`` or raise ``CapacityExceeded`` at the cap (``force``: count it anyway)."""
        count = self._streams.get(key, 0)
        if self._max_streams is not None and count >= self._max_streams and not force:
            raise CapacityExceeded(
                f"{key!r} already has {count} open streams (max_streams_per_org {self._max_streams}); close one first",
                scope="org_streams", retry_after=5.0)
        self._streams[key] = count + 1

    def close_stream(self, key: str) -> None:
        count = self._streams.get(key, 0) - 1
        if count > 0:
            self._streams[key] = count
        else:
            self._streams.pop(key, None)
