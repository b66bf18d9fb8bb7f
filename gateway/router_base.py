"""What the session router and its lifecycle share: the events they report and their tuning.

Both :class:`~gateway.sessions.SessionRouter` and :class:`~gateway.lifecycle.Lifecycle` are
built from these (by ``gateway.app``, or by a test with its own), so neither imports the other
for them: the router calls the lifecycle, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class RouterEvents(Protocol):
    """What the router reports; ``gateway.metrics`` implements it, tests may too."""

    def route_cache(self, hit: bool) -> None: ...
    def provisioned(self, pool: str, seconds: float, outcome: str) -> None: ...
    def capacity_rejected(self, scope: str) -> None: ...
    def reaped(self, reason: str) -> None: ...
    def denied(self, reason: str) -> None: ...
    def suspended(self, pool: str, outcome: str) -> None: ...
    def resumed(self, pool: str, outcome: str) -> None: ...
    def wake_waiting(self, pool: str, delta: int) -> None: ...
    def woken(self, pool: str, seconds: float) -> None: ...
    def reap_pass(self, acted: int, seconds: float) -> None: ...


class NoEvents:
    """The null object: a router without metrics reports into the void."""

    def route_cache(self, hit: bool) -> None: ...
    def provisioned(self, pool: str, seconds: float, outcome: str) -> None: ...
    def capacity_rejected(self, scope: str) -> None: ...
    def reaped(self, reason: str) -> None: ...
    def denied(self, reason: str) -> None: ...
    def suspended(self, pool: str, outcome: str) -> None: ...
    def resumed(self, pool: str, outcome: str) -> None: ...
    def wake_waiting(self, pool: str, delta: int) -> None: ...
    def woken(self, pool: str, seconds: float) -> None: ...
    def reap_pass(self, acted: int, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class RouterTuning:
    route_ttl: float = 30.0          # how long a cached route is trusted without the store
    route_stale_ttl: float = 300.0   # how long a cached route may serve while the store is down
    route_cache_size: int = 100_000
    # The lease of a creation, suspend or wake (at most half the pool's wake_timeout): renewed every quarter
    # of it while its replica works on it, so a replica that died holds the sandbox this long at most.
    lease_seconds: float = 10.0
    session_ttl: float = 86_400.0    # a binding idle this long is forgotten
    # The holder renews the reaper lease every reaper_lease_renew seconds (and on each pass), so a
    # dead holder's lease lapses within reaper_lease_ttl and another replica reaps from its next pass.
    reaper_lease_ttl: float = 15.0   # a few renewals long: one slow store call does not lose it
    reaper_lease_renew: float = 5.0
    reap_batch: int = 500            # index entries (and sessions) one reaper batch examines at most
    reap_concurrency: int = 32       # sandboxes a reaper batch acts on at once
    reap_budget: float = 5.0         # seconds a reaper pass goes on while more is due (serve: 4 x reap_interval)
    sweep_batch: int = 500           # provider objects one orphan sweep checks at most
    # No sandbox is reaped or suspended sooner than this after its last request began, whatever its
    # idle_timeout: a request younger than the data plane's LONG_REQUEST_AFTER (10 s) counts only by
    # its start, until it is promoted to a stream and that count is flushed (activity_flush_interval).
    activity_grace: float = 20.0
    # How often replicas flush recorded activity to the store (serve: activity_flush_interval, plus a
    # margin): an operator's suspend sees a sandbox quiet twice this far apart before it suspends it.
    activity_flush: float = 1.5
