"""Reading a child's report from a pipe without blocking the loop.

Not ``loop.connect_read_pipe``: uvloop's pipe transport hands libuv the file object's own
descriptor, so the transport and the file object each close the same number
(MagicStack/uvloop#763). Between the two closes another thread can be given that number (a
sandbox's ``prepare`` opening its UID registry lock in a worker thread, say), and the second close
takes it from under it: a sporadic ``[Errno 9] Bad file descriptor`` in whatever that thread does
next. Here the descriptor is watched with ``add_reader`` and closed exactly once, by us.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


async def read_until(fd: int, done: Callable[[bytes], bool]) -> bytes:
    """Read from the pipe ``fd`` until ``done(data)`` or EOF; closes ``fd`` (whatever happens)."""
    loop = asyncio.get_running_loop()
    data = b""
    try:
        os.set_blocking(fd, False)
        while not done(data):
            readable = loop.create_future()
            loop.add_reader(fd, _settle, readable)
            try:
                await readable
            finally:
                loop.remove_reader(fd)
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:  # a wakeup with nothing to read: wait again
                continue
            if not chunk:
                break
            data += chunk
        return data
    finally:
        os.close(fd)


def _settle(readable: asyncio.Future[None]) -> None:
    if not readable.done():
        readable.set_result(None)
