"""A local runtime is spawned off the event loop, without the GIL (gateway/providers/_spawn.py).

``os.posix_spawnp`` on the loop thread held it until each child exec'd: in a wake storm on a loaded host,
0.4 s per child and 6 s in all per replica, measured, and lease renewals fired seconds late (issue 27).
A child kept from exec'ing (its file action opens a FIFO nobody writes yet) shows the loop running meanwhile.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gateway.providers._spawn import spawn


async def test_the_loop_runs_while_a_child_has_not_exec_d_yet(tmp_path: Path) -> None:
    fifo, out = tmp_path / "fifo", tmp_path / "out"
    os.mkfifo(fifo)
    spawning = asyncio.create_task(spawn("sh", ["sh", "-c", f"cat <&3 >{out}; ps -o sid= -p $$ >>{out}"],
                                         {"PATH": "/usr/bin:/bin"}, [(os.POSIX_SPAWN_OPEN, 3, str(fifo), os.O_RDONLY, 0)]))
    ticks = 0
    for _ in range(20):  # the child is blocked in its file action, before exec
        await asyncio.sleep(0.005)
        ticks += 1
    assert not spawning.done() and ticks == 20
    writer = await asyncio.to_thread(os.open, fifo, os.O_WRONLY)  # lets the child go on
    os.write(writer, b"hello\n")
    os.close(writer)
    pid = await asyncio.wait_for(spawning, 10)
    await asyncio.to_thread(os.waitpid, pid, 0)
    text, sid = out.read_text().split()
    assert text == "hello" and int(sid) == pid  # the file action held, in a session of its own


async def test_a_spawn_that_fails_raises_os_error() -> None:
    with pytest.raises(FileNotFoundError):
        await spawn("/nonexistent/runtime", ["runtime"], {}, [])
