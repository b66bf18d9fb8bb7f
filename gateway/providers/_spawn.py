"""``posix_spawnp`` off the event loop, without the GIL: a runtime slow to start does not stop the gateway.

``os.posix_spawnp`` holds the GIL for the whole call, and glibc's ``posix_spawn`` returns only once the
child has run its file actions and exec'd. On a loaded host (a wake storm: a hundred runtimes starting on
two cores) that took up to 0.4 s per child and 6 s in all per replica, measured, on the loop thread: every
timer (a wake's lease renewals) fired seconds late and the leases lapsed (issue 27). Called through ctypes
(which releases the GIL) on a thread of its own, the wait costs the loop nothing.

Same arguments and file actions as ``os.posix_spawnp(path, argv, env, setsid=True, file_actions=...)``
(``POSIX_SPAWN_OPEN`` and ``POSIX_SPAWN_DUP2`` only); glibc's structure sizes are given room to spare.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["spawn"]

_POSIX_SPAWN_SETSID = 0x80  # glibc
_FILE_ACTIONS_SIZE = 256  # glibc: 80 bytes
_ATTR_SIZE = 1024  # glibc: 336 bytes
_THREADS = 4  # spawns at once; apart from the default executor, which prepare and rmtree need

_libc = ctypes.CDLL(None, use_errno=True)
_executor = ThreadPoolExecutor(_THREADS, thread_name_prefix="spawn")


def _strings(items: Sequence[str]) -> Any:
    array = (ctypes.c_char_p * (len(items) + 1))()
    array[:-1] = [os.fsencode(item) for item in items]
    array[-1] = None
    return array


def _spawn_blocking(path: str, argv: Sequence[str], env: Mapping[str, str],
                    file_actions: Sequence[tuple[Any, ...]]) -> int:
    actions = ctypes.create_string_buffer(_FILE_ACTIONS_SIZE)
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    _check(_libc.posix_spawn_file_actions_init(actions))
    _check(_libc.posix_spawnattr_init(attr))
    try:
        for action in file_actions:
            if action[0] == os.POSIX_SPAWN_OPEN:
                _, fd, name, flags, mode = action
                _check(_libc.posix_spawn_file_actions_addopen(actions, fd, os.fsencode(name), flags, mode))
            elif action[0] == os.POSIX_SPAWN_DUP2:
                _check(_libc.posix_spawn_file_actions_adddup2(actions, action[1], action[2]))
            else:
                raise ValueError(f"unsupported file action {action!r}")
        _check(_libc.posix_spawnattr_setflags(attr, ctypes.c_short(_POSIX_SPAWN_SETSID)))
        pid = ctypes.c_int()
        _check(_libc.posix_spawnp(ctypes.byref(pid), os.fsencode(path), actions, attr, _strings(argv),
                                  _strings([f"{key}={value}" for key, value in env.items()])))
        return pid.value
    finally:
        _libc.posix_spawn_file_actions_destroy(actions)
        _libc.posix_spawnattr_destroy(attr)


def _check(err: int) -> None:
    if err:
        raise OSError(err, os.strerror(err))  # OSError picks the subclass (FileNotFoundError, ...)


async def spawn(path: str, argv: Sequence[str], env: Mapping[str, str],
                file_actions: Sequence[tuple[Any, ...]]) -> int:
    """``os.posix_spawnp(path, argv, env, setsid=True, file_actions=file_actions)`` on a spawn thread;
    the pid. The descriptors the actions name must stay open until it returns."""
    return await asyncio.get_running_loop().run_in_executor(_executor, _spawn_blocking, path, argv, env,
                                                            file_actions)
