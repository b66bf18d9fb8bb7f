"""LocalProvider's start-up handshake, against stand-in runtimes (real processes, unconfined:
the handshake is the same under bubblewrap, which tests/test_confinement.py covers)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import sys
from pathlib import Path

import pytest

from gateway.errors import ProvisionFailed
from gateway.model import Isolation, Owner, SandboxRequest
from gateway.providers.base import Probe
from gateway.providers.confine import Unconfined
from gateway.providers.local import LocalProvider

# A stand-in for `python -m gateway.runtime --listen-fd 3`: says LISTENING, then either starts
# answering on the inherited socket only after a while (slow) or exits (dead).
STAND_IN = '''
import socket, sys, time
mode = sys.argv[1]
sock = socket.socket(fileno=3)
print("LISTENING fd 3", flush=True)
if mode == "dead":
    sys.exit(1)
time.sleep(0.6)  # listening (the gateway bound it) but not accepting: health checks wait until now
while True:
    conn, _ = sock.accept()
    try:  # a health check that gave up (closed) while the runtime was paused must not end it
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\nok")
    except OSError:
        pass
    conn.close()
'''


def stand_in(tmp_path: Path, mode: str) -> str:
    """An executable that LocalProvider runs as its python (its argv carries the sandbox ID)."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    exe = tmp_path / f"python-{mode}"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {script} {mode} "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def request(sandbox_id: str) -> SandboxRequest:
    # An hour: were a dead runtime waited for until the provisioning timeout, the test would time out.
    return SandboxRequest(sandbox_id, "small", Isolation.PER_SESSION, Owner(None, "u", None), "s", timeout=3600.0)


@pytest.fixture
async def provider_for(tmp_path):
    started: list[LocalProvider] = []

    async def make(mode: str) -> LocalProvider:
        provider = LocalProvider(tmp_path / f"data-{mode}", stop_on_close=True,
                                 confinement=Unconfined(stand_in(tmp_path, mode)))

        def lost(sandbox_id: str) -> None:  # a LostHandler is called, not awaited
            return None

        await provider.start(lost)
        started.append(provider)
        return provider

    yield make
    for provider in started:
        await provider.close()


async def test_a_runtime_slow_to_answer_is_waited_for(provider_for):
    provider = await provider_for("slow")
    endpoint = await provider.ensure(request("ses-slow"))
    assert endpoint.unix is not None and Path(endpoint.unix).is_socket()
    assert endpoint.host == "ses-slow"  # the data plane pools connections per host: one sandbox's own


async def test_a_runtime_that_exits_after_listening_fails_at_once(provider_for):
    provider = await provider_for("dead")
    with pytest.raises(ProvisionFailed, match="exited before answering its health check"):
        await provider.ensure(request("ses-dead"))


async def test_a_data_dir_too_long_for_socket_paths_puts_the_sockets_in_the_runtime_dir(tmp_path):
    provider = LocalProvider(tmp_path / ("d" * 100), stop_on_close=True,
                             confinement=Unconfined(stand_in(tmp_path, "slow")))
    await provider.start(lambda _sandbox_id: None)
    try:
        endpoint = await provider.ensure(request("ses-long"))
    finally:
        await provider.close()
    assert endpoint.unix is not None and len(endpoint.unix) <= 107
    assert not Path(endpoint.unix).exists()  # closing a memory-store gateway's provider stopped the sandbox


async def test_probe_reads_the_registry_and_the_process(provider_for, tmp_path):
    """What any replica of this host can tell about a sandbox it cannot reach, whoever started it."""
    provider = await provider_for("slow")
    assert await provider.probe("ses-never", "small") is Probe.GONE  # no registry entry
    await provider.ensure(request("ses-probe"))
    assert await provider.probe("ses-probe", "small") is Probe.ALIVE
    other = LocalProvider(tmp_path / "data-slow", stop_on_close=False)  # another replica, same registry
    state = json.loads((tmp_path / "data-slow" / "sandboxes" / "ses-probe" / "state.json").read_text())
    fd = os.pidfd_open(state["pid"])
    try:
        os.kill(state["pid"], signal.SIGKILL)
        assert select.select([fd], [], [], 10)[0]  # exited
    finally:
        os.close(fd)
    assert await other.probe("ses-probe", "small") is Probe.GONE


async def test_a_late_exit_of_a_runtime_another_replica_restarted_is_not_a_loss(tmp_path):
    """Replica A watches a sandbox; replica B suspends and wakes it (a new runtime). A's event for the
    old runtime's exit arrives only after that (a busy loop): A must not report the sandbox lost, which
    would release the running one (a 502 for the requests the wake was serving)."""
    exe = stand_in(tmp_path, "slow")
    lost: list[str] = []
    a = LocalProvider(tmp_path / "data", stop_on_close=False, confinement=Unconfined(exe))
    b = LocalProvider(tmp_path / "data", stop_on_close=True, confinement=Unconfined(exe))
    await a.start(lost.append)
    await b.start(lost.append)
    try:
        await b.ensure(request("ses-late"))
        await a.ensure(request("ses-late"))  # A finds it running: A watches the same runtime
        loop = asyncio.get_running_loop()
        fd, old_pid = a._watched["ses-late"]
        loop.remove_reader(fd)  # A's loop does not get to the exit event until the wake is done
        await b.suspend("ses-late", "small")
        await b.resume(request("ses-late"))
        assert select.select([fd], [], [], 10)[0]  # the old runtime is gone ...
        exited = loop.create_future()
        loop.add_reader(fd, lambda: (a._exited("ses-late"), exited.done() or exited.set_result(None)))
        await exited  # ... and A handles its exit now, late
        assert lost == []
        state = json.loads((tmp_path / "data" / "sandboxes" / "ses-late" / "state.json").read_text())
        assert state["pid"] != old_pid and await a.probe("ses-late", "small") is Probe.ALIVE
    finally:
        await a.close()
        await b.close()


async def test_a_runtime_another_replica_started_is_waited_for_not_replaced(tmp_path):
    """Two replicas resume one sandbox (a wake taken over after a late renewal). The second finds the
    first's runtime running but not answering in time (a busy host; here: paused): it waits for it
    and returns it, where it used to start a second runtime beside it (SIGTERM does not end a paused
    process), and both replicas' resumes end with one runtime."""
    exe = stand_in(tmp_path, "slow")
    a = LocalProvider(tmp_path / "data", stop_on_close=True, confinement=Unconfined(exe))
    b = LocalProvider(tmp_path / "data", stop_on_close=False, confinement=Unconfined(exe))
    await a.start(lambda _sandbox_id: None)
    await b.start(lambda _sandbox_id: None)
    try:
        first = await a.resume(request("ses-twice"))
        state = json.loads((tmp_path / "data" / "sandboxes" / "ses-twice" / "state.json").read_text())
        os.kill(state["pid"], signal.SIGSTOP)  # running, not answering
        taking_over = asyncio.create_task(b.resume(request("ses-twice")))
        await asyncio.sleep(2.5)  # past a health check's 2 s timeout: the runtime still does not answer
        assert not taking_over.done()
        os.kill(state["pid"], signal.SIGCONT)
        assert await taking_over == first
        again = json.loads((tmp_path / "data" / "sandboxes" / "ses-twice" / "state.json").read_text())
        assert again["pid"] == state["pid"]
    finally:
        await b.close()
        await a.close()
