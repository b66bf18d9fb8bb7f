"""ConnectionGate: how many connections one listener holds, in all and per source address.

Why: every accepted connection costs a file descriptor, and the process has a fixed number of them
(``serve`` raises its soft limit to the hard one and logs both). Without a bound a few thousand idle
connections to one port (the gRPC front, or a slowloris on the data plane) take every descriptor, and
then everything fails: the other ports, the control API's health checks, connections to sandboxes.
A listener's bound (``max_connections``) and a per-address bound (``max_connections_per_client``, so
one source cannot take a whole listener) keep a reserve for the rest; the defaults are derived from the
descriptor limit (:func:`connection_bounds`). A connection past a bound is refused at once, by the
listener's own protocol (HTTP: 503 with Retry-After and the JSON error; gRPC: GOAWAY ENHANCE_YOUR_CALM),
and counted (``sgw_connections_refused_total``).
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable, Hashable

MAX_CONNECTIONS = "max_connections"
MAX_CONNECTIONS_PER_CLIENT = "max_connections_per_client"

# Of the descriptor limit, what each client-facing listener (the data plane, the gRPC front) may hold: a
# data-plane connection may need a second descriptor towards its sandbox, so the two listeners at their
# bounds use 3/5 of the table and leave 2/5 to the control API, sandboxes' processes and pipes, the store.
_SHARE = 5
_PER_CLIENT_SHARE = 8   # one source address may hold an eighth of a listener's bound
_MIN_PER_CLIENT = 16


def descriptor_limit() -> int:
    """This process's soft limit on open descriptors (what ``serve`` raised it to)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one (``serve`` at start); returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft, soft
    return soft, hard


def connection_bounds(max_connections: int | None, per_client: int | None,
                      limit: int | None = None) -> tuple[int, int]:
    """The bounds a listener enforces: the settings where set, else derived from the descriptor limit."""
    fds = descriptor_limit() if limit is None else limit
    total = max_connections if max_connections is not None else max(64, fds // _SHARE)
    client = per_client if per_client is not None else max(_MIN_PER_CLIENT, total // _PER_CLIENT_SHARE)
    return total, min(client, total)


class ConnectionGate:
    """Counts one listener's open connections; :meth:`admit` says which bound a new one would pass."""

    __slots__ = ("listener", "limit", "per_client", "open", "by_client", "on_refused")

    def __init__(self, listener: str, limit: int = sys.maxsize, per_client: int = sys.maxsize, *,
                 on_refused: Callable[[str, str], None] | None = None) -> None:
        self.listener = listener
        self.limit = limit
        self.per_client = per_client
        self.open = 0
        self.by_client: dict[Hashable, int] = {}
        self.on_refused = on_refused

    def admit(self, client: Hashable) -> str | None:
        """Count a new connection from ``client`` (its address); or, past a bound, the bound's name (the
        connection is then not counted: the caller refuses it and never calls :meth:`release`)."""
        held = self.by_client.get(client, 0)
        bound = (MAX_CONNECTIONS if self.open >= self.limit
                 else MAX_CONNECTIONS_PER_CLIENT if held >= self.per_client else None)
        if bound is not None:
            if self.on_refused is not None:
                self.on_refused(self.listener, bound)
            return bound
        self.open += 1
        self.by_client[client] = held + 1
        return None

    def release(self, client: Hashable) -> None:
        self.open -= 1
        held = self.by_client.get(client, 0) - 1
        if held > 0:
            self.by_client[client] = held
        else:
            self.by_client.pop(client, None)

    def refusal(self, bound: str) -> str:
        """What a refused client is told: the bound and the setting that moves it."""
        value = self.limit if bound == MAX_CONNECTIONS else self.per_client
        scope = "this port" if bound == MAX_CONNECTIONS else "one client address on this port"
        return (f"too many connections: {scope} may hold {value} ({bound}, SANDBOX_GATEWAY_{bound.upper()}); "
                "retry later or reuse connections")
