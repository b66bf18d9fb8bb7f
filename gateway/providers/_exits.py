"""Waiting for a process to exit through its pidfd, with a kill after a grace period.

A pidfd names one process for good (a recycled PID cannot fool it) and becomes
readable when that process exits, so the wait needs no polling and no SIGCHLD.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def exit_or_kill(pidfd: int, grace: float, kill: Callable[[], None]) -> None:
    """Wait up to ``grace`` for the process behind ``pidfd`` to exit, then ``kill()`` it and wait
    another ``grace`` (TimeoutError past that). The caller owns ``pidfd`` and closes it."""
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
    try:
        try:
            await asyncio.wait_for(asyncio.shield(exited), grace)
        except TimeoutError:
            kill()
            await asyncio.wait_for(exited, grace)
    finally:
        loop.remove_reader(pidfd)
