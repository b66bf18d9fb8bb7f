"""What the front changes under grpclib's protocol layer, for speed only: batched writes and h2's frame repr.

Batched writes. grpclib writes h2's output to the transport after every h2 call
(a request head, a DATA frame, a WINDOW_UPDATE for data read, the end of a
stream), and each of those is a ``send()`` system call: profiled, a third of the
gateway's time under unary load. :class:`BatchingTransport` stands between
grpclib's ``Connection``/``Stream`` and the real transport and collects what is
written during one event-loop step into one write at the end of it (a
``call_soon`` callback). Order is kept (one buffer per connection); back
pressure is unchanged in kind: the real transport still calls the protocol's
``pause_writing``, at most one loop step later, and what a step can write is
bounded by the peer's HTTP/2 windows as before. ``close`` sends what is pending
first (a GOAWAY or RST_STREAM written just before closing is not lost).

h2's frame repr. h2 4.x formats ``repr(frame)`` for a trace log line on every
frame it receives (``H2Connection._receive_frame``), whether a logger is
configured or not (its default logger ignores the line): for a DATA frame that
serializes the body again, 5% of the gateway's time in a stream. h2 offers no
setting to skip it, so :func:`defer_h2_frame_repr` gives the module ``h2.connection``
its own ``repr`` (a module global shadows the builtin for that module only, and
that line is the module's one ``repr`` call): it returns an object that formats
the frame only if a logger does format the line. Log output is unchanged.
"""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

import h2.connection
from grpclib.protocol import H2Protocol


class BatchingTransport:
    """The transport as grpclib's Connection and Stream see it: writes of one loop step go out as one."""

    __slots__ = ("_transport", "_loop", "_pending", "_scheduled")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._pending.append(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class BatchingProtocol(H2Protocol):
    """grpclib's protocol over a :class:`BatchingTransport` (client and server side alike)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        batching = BatchingTransport(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        super().connection_made(batching)  # type: ignore[arg-type]


class _DeferredRepr:
    """``repr(obj)``, computed only when formatted (``%s``)."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __str__(self) -> str:
        return builtins.repr(self.obj)

    __repr__ = __str__


def defer_h2_frame_repr() -> None:
    """Make h2's per-frame trace line cost nothing unless it is logged (see the module docstring). Idempotent."""
    h2.connection.repr = _DeferredRepr  # type: ignore[attr-defined]
