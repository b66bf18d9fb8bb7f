"""The lock on a local sandbox's directory, shared by every replica (and installation) on the host.

An exclusive ``flock`` on the directory's ``lock`` file: creations, resumes, suspends and deletes of
one sandbox take it, so two replicas never start two runtimes for it or delete one being started.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

#: How often a lock held by another replica is tried again: from 5 ms, doubling to 100 ms.
LOCK_POLL_FIRST, LOCK_POLL_MAX = 0.005, 0.1


class FileLock:
    """An exclusive ``flock`` on a file, tried without blocking and again after a growing pause.

    Not a blocking ``flock`` in a worker thread: a wait for a lock another replica holds (through
    its whole start, seconds) would hold one of the loop's few default-executor threads, which
    ``prepare``, ``rmtree`` and name resolution need, and two replicas each waiting on the other's
    lock could run both executors dry; and a cancelled wait left its thread blocked, to lock
    whatever file took the descriptor's number once it was closed. There is no event for a lock
    coming free, so it is polled: every LOCK_POLL_FIRST seconds at first, at most every LOCK_POLL_MAX."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1

    async def __aenter__(self) -> None:
        # A delete removes the sandbox's directory, lock file included, while it holds the lock: a waiter
        # then holds a lock on a file no one else can open, and the next caller locks a new one beside it.
        # So the lock counts only once it is on the file at the path; else (or when the directory vanished
        # between the mkdir and the open) it is taken again.
        while True:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            except FileNotFoundError:
                continue
            try:
                await _flock(fd)
                if _same_file(fd, self._path):
                    self._fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    async def __aexit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


async def _flock(fd: int) -> None:
    pause = LOCK_POLL_FIRST
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            await asyncio.sleep(pause)
            pause = min(pause * 2, LOCK_POLL_MAX)


def _same_file(fd: int, path: Path) -> bool:
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (here.st_dev, here.st_ino)
