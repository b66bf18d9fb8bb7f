"""ReadyHeads: which held slow heads have bytes waiting, asked once a tick in one system call.

A slow head (a slowloris: a request head dribbled a line every few seconds) is paused between ticks
(``DownstreamConnection.hold_slow_head``), so that thousands of lines sent at once are read a slice per
loop turn. Waking every held head each tick to find out whether it sent anything cost a resume, a read
attempt and a pause per connection per tick: 8,000 wakes a second for 4,000 held heads at a 0.5 s tick,
seven in eight of them for nothing, about an eighth of a core (issue 28). Instead the held sockets sit in
an epoll set of their own, apart from the event loop's, and the tick asks it without blocking: the cost is
one call plus what is ready, not a pass over every held connection. It is asked for a slice of them at a
time (``DataPlane.wake_slow_heads`` asks for the next as it finishes one): 4,000 ready heads taken in one
call were 2-3 ms of one loop turn, every tick.

The set is level-triggered and asked only by the tick; a connection is added when first held and stays
until it closes, or until a tick finds it ready while it is not held (it is read as usual then). The
kernel drops a socket from the set when it closes, so a descriptor number reused by a new connection is
never mistaken for the old one: the maps below are checked by identity before anything is removed.

Where epoll does not exist, every held head is taken as ready (each is woken every tick).
"""

from __future__ import annotations

import select
from typing import Any

_EPOLLIN = getattr(select, "EPOLLIN", 1)


class ReadyHeads:
    """The sockets of held slow heads, and which of them have something to read."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._fd_of: dict[Any, int] = {}      # connection -> its descriptor, while in the set
        self._at_fd: dict[int, Any] = {}      # descriptor -> the connection it was added for

    def watch(self, client: Any) -> bool:
        """Add ``client``'s socket to the set (once). False when it cannot be watched: it must not be held
        then, or nothing would wake it before its deadline."""
        epoll = self._epoll
        if epoll is None or client in self._fd_of:
            return True
        sock = client.transport.get_extra_info("socket") if client.transport is not None else None
        if sock is None:
            return False
        try:
            fd = sock.fileno()
            try:
                epoll.register(fd, _EPOLLIN)
            except FileExistsError:  # added for a connection whose close is not yet reported: the same socket
                epoll.modify(fd, _EPOLLIN)
        except (OSError, ValueError):
            return False
        self._fd_of[client] = fd
        self._at_fd[fd] = client
        return True

    def forget(self, client: Any) -> None:
        """``client`` is closed, or no longer needs watching."""
        fd = self._fd_of.pop(client, None)
        if fd is not None and self._at_fd.get(fd) is client:
            del self._at_fd[fd]
            try:
                self._epoll.unregister(fd)  # type: ignore[union-attr]
            except (OSError, ValueError):  # closed already: the kernel dropped it from the set
                pass

    def ready(self, held: dict[Any, None], most: int) -> list[Any]:
        """Up to ``most`` of the connections of ``held`` with bytes (or an end) waiting (the set is
        level-triggered: the kernel hands the others out on the next calls); a ready one no longer held is
        dropped from the set."""
        epoll = self._epoll
        if epoll is None:
            return list(held)
        at_fd = self._at_fd
        if not at_fd:
            return []
        ready = []
        for fd, _ in epoll.poll(0, min(most, len(at_fd))):
            client = at_fd.get(fd)
            if client is None:
                continue
            if client in held:
                ready.append(client)
            else:
                self.forget(client)
        return ready

    def __len__(self) -> int:
        return len(self._fd_of)

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
        self._fd_of.clear()
        self._at_fd.clear()


__all__ = ["ReadyHeads"]
