"""ConnectionGate: how many connections one listener holds, in all and per source address.

Why: every accepted connection costs a file descriptor, and the process has a fixed number of them
(``serve`` raises its soft limit to the hard one and logs both). Without a bound a few thousand idle
connections to one port (the gRPC front, or a slowloris on the data plane) take every descriptor, and
then everything fails: the other ports, the control API's health checks, connections to sandboxes.
A listener's bound (``max_connections``) and a per-address bound (``max_connections_per_client``, so
one source cannot take a whole listener) keep a reserve for the rest; the defaults are derived from the
descriptor limit (:func:`connection_bounds`). A connection past a bound is refused at once, by the
listener's own protocol (HTTP: 503 with Retry-After and the JSON error; gRPC: GOAWAY ENHANCE_YOUR_CALM),
and counted (``sgw_connections_refused_total``). A listener at its total bound first sheds an idle connection
of the address holding the most (:class:`ConnectionGate`), so many addresses together cannot shut a new one
out; counted in ``sgw_connections_shed_total``.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable, Hashable
from typing import Protocol

MAX_CONNECTIONS = "max_connections"
MAX_CONNECTIONS_PER_CLIENT = "max_connections_per_client"

# Of the descriptor limit, what each client-facing listener (the data plane, the gRPC front) may hold: a
# data-plane connection may need a second descriptor towards its sandbox, so the two listeners at their
# bounds use 3/5 of the table and leave 2/5 to the control API, sandboxes' processes and pipes, the store.
_SHARE = 5
_PER_CLIENT_SHARE = 8   # one source address may hold an eighth of a listener's bound
_MIN_PER_CLIENT = 16
SHED_SCAN = 256  # connections a full listener looks at for an idle one to shed, at most, per newcomer


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


class Sheddable(Protocol):
    """What a listener's connection offers its gate: whether it may be closed now (no request or call in
    flight) and the close itself (a GOAWAY, or a plain close between HTTP requests)."""

    def sheddable(self) -> bool: ...

    def shed(self) -> None: ...


class ConnectionGate:
    """Counts one listener's open connections; :meth:`admit` takes a new one in, or says which bound it
    would pass.

    At ``max_connections`` a newcomer is not refused outright: many addresses together can fill a listener
    (at the default bounds, eight addresses of 500 fill 4,000), and a victim from a ninth must still get in.
    So the gate sheds the oldest idle connection (no request or call in flight) of the address that holds
    the most, when that address holds at least two more than the newcomer's: each shed makes the spread of
    connections over addresses strictly fairer, a request in flight is never cut, and an address already
    holding the most is refused (it cannot push others out). The search is bounded (:data:`SHED_SCAN`
    connections looked at), so a listener full of busy connections refuses in constant time.
    """

    __slots__ = ("listener", "limit", "per_client", "open", "conns", "on_refused", "on_shed", "_holding", "_top")

    def __init__(self, listener: str, limit: int = sys.maxsize, per_client: int = sys.maxsize, *,
                 on_refused: Callable[[str, str], None] | None = None,
                 on_shed: Callable[[str], None] | None = None) -> None:
        self.listener = listener
        self.limit = limit
        self.per_client = per_client
        self.open = 0
        self.conns: dict[Hashable, dict[Sheddable, None]] = {}  # per address, oldest first
        self.on_refused = on_refused
        self.on_shed = on_shed
        self._holding: dict[int, dict[Hashable, None]] = {}  # n -> the addresses holding n connections
        self._top = 0  # the most any address holds (an upper bound: lowered as its bucket empties)

    @property
    def by_client(self) -> dict[Hashable, int]:
        """Connections held per address."""
        return {client: len(conns) for client, conns in self.conns.items()}

    def held(self, client: Hashable) -> int:
        conns = self.conns.get(client)
        return len(conns) if conns is not None else 0

    def admit(self, client: Hashable, conn: Sheddable) -> str | None:
        """Count ``conn``, a new connection from ``client`` (its address), shedding another if the listener is
        full and that is fair; or, past a bound, the bound's name (``conn`` is then not counted: the caller
        refuses it, and :meth:`release` of it does nothing)."""
        held = self.held(client)
        bound = (MAX_CONNECTIONS_PER_CLIENT if held >= self.per_client
                 else MAX_CONNECTIONS if self.open >= self.limit and not self._shed_for(held) else None)
        if bound is not None:
            if self.on_refused is not None:
                self.on_refused(self.listener, bound)
            return bound
        self.open += 1
        conns = self.conns.get(client)
        if conns is None:
            conns = self.conns[client] = {}
        conns[conn] = None
        self._move(client, held, held + 1)
        return None

    def release(self, client: Hashable, conn: Sheddable) -> None:
        """``conn`` closed: its slot comes back (nothing, if it was never counted or was shed)."""
        conns = self.conns.get(client)
        if conns is None or conn not in conns:
            return
        del conns[conn]
        self.open -= 1
        held = len(conns)
        if not held:
            del self.conns[client]
        self._move(client, held + 1, held)

    def _move(self, client: Hashable, before: int, after: int) -> None:
        holding = self._holding
        if before:
            bucket = holding[before]
            del bucket[client]
            if not bucket:
                del holding[before]
        if after:
            bucket = holding.get(after)
            if bucket is None:
                bucket = holding[after] = {}
            bucket[client] = None
            if after > self._top:
                self._top = after
        while self._top and self._top not in holding:
            self._top -= 1

    def _shed_for(self, held: int) -> bool:
        """Close an idle connection of an address holding at least ``held + 2``, the most first; True if one
        was (its slot is free at once: its own close, later, releases nothing)."""
        budget = SHED_SCAN
        for count in range(self._top, held + 1, -1):
            for client in tuple(self._holding.get(count, ())):
                for conn in self.conns[client]:
                    if conn.sheddable():
                        self.release(client, conn)
                        conn.shed()
                        if self.on_shed is not None:
                            self.on_shed(self.listener)
                        return True
                    budget -= 1
                    if not budget:
                        return False
        return False

    def refusal(self, bound: str) -> str:
        """What a refused client is told: the bound and the setting that moves it."""
        value = self.limit if bound == MAX_CONNECTIONS else self.per_client
        scope = "this port" if bound == MAX_CONNECTIONS else "one client address on this port"
        return (f"too many connections: {scope} may hold {value} ({bound}, SANDBOX_GATEWAY_{bound.upper()}); "
                "retry later or reuse connections")
