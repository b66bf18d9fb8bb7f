"""A host's local sandboxes are bounded as a whole: a cap on how many run at once (derived from the host's
memory and open-file table unless set), a free-space floor on the data dir below which no new sandbox
starts (507, naming the setting, never a provision_failed), and per-sandbox limits whose processes x open
files product, times the cap, stays under half the host's file table. Real bubblewrap, the whole gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.providers.confine import Limits, host_sandbox_cap
from gateway.settings import Settings
from tests.proxy_helpers import listening_socket


async def start(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession]]:
    config = Settings(data_dir=(tmp_path / "data").absolute(), per_session_org_ids="org", access_log=False,
                      **settings)
    gateway = Gateway.create(config)
    await gateway.start(listening_socket(), listening_socket())
    try:
        async with aiohttp.ClientSession() as http:
            yield gateway, http
    finally:
        await gateway.stop()


async def run(gateway: Gateway, http: aiohttp.ClientSession, session: str) -> tuple[int, dict[str, Any]]:
    assert gateway.data_address is not None
    headers = {"X-Org-Id": "org", "X-User-Id": "u", "X-Session-Id": session}
    async with http.post(f"http://127.0.0.1:{gateway.data_address[1]}/execute", headers=headers,
                         json={"command": "echo ok", "timeout_seconds": 30}) as response:
        return response.status, await response.json()


@pytest.fixture
async def capped(tmp_path: Path) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession]]:
    async for pair in start(tmp_path, local_max_sandboxes=1):
        yield pair


@pytest.fixture
async def full_disk(tmp_path: Path) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession]]:
    async for pair in start(tmp_path, local_min_free_bytes=2**62):  # more than any disk has free
        yield pair


async def test_past_the_host_cap_a_new_sandbox_is_refused_with_429_until_one_ends(capped):
    gateway, http = capped
    status, body = await run(gateway, http, "s1")
    assert status == 200 and body["stdout"] == "ok\n", body
    status, body = await run(gateway, http, "s2")
    assert status == 429, body
    assert body["error"]["code"] == "capacity_exceeded" and "local_max_sandboxes" in body["error"]["message"]
    assert gateway.control_address is not None
    async with http.delete(f"http://127.0.0.1:{gateway.control_address[1]}/v1/sessions/s1") as deleted:
        assert deleted.status in (200, 204)
    status, body = await run(gateway, http, "s2")
    assert status == 200, body


async def test_below_the_free_space_floor_a_new_sandbox_gets_507_naming_the_setting(full_disk):
    gateway, http = full_disk
    status, body = await run(gateway, http, "s1")
    assert status == 507, body
    assert body["error"]["code"] == "insufficient_storage"
    assert "SANDBOX_GATEWAY_LOCAL_MIN_FREE_BYTES" in body["error"]["message"]


@pytest.fixture
async def small_disks(tmp_path: Path) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession]]:
    async for pair in start(tmp_path, local_disk_quota_bytes=32 * 1024**2):
        yield pair


async def run_command(gateway: Gateway, http: aiohttp.ClientSession, session: str, command: str) -> dict[str, Any]:
    assert gateway.data_address is not None
    headers = {"X-Org-Id": "org", "X-User-Id": "u", "X-Session-Id": session}
    async with http.post(f"http://127.0.0.1:{gateway.data_address[1]}/execute", headers=headers,
                         json={"command": command, "timeout_seconds": 30}) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def loops_under(path: Path) -> list[str]:
    """The loop devices whose backing file is under ``path`` (the sandboxes' disk images in use)."""
    found = []
    for device in Path("/sys/block").glob("loop*"):
        with contextlib.suppress(OSError):
            backing = (device / "loop" / "backing_file").read_text().strip()
            if backing.startswith(str(path)):
                found.append(backing)
    return found


def mounts_under(path: Path) -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(path))]


@pytest.mark.skipif(os.geteuid() != 0, reason="disk quotas are loop mounts: root only")
async def test_a_sandbox_that_fills_its_disk_gets_enospc_and_its_neighbour_writes_on(small_disks, tmp_path):
    gateway, http = small_disks
    data = tmp_path / "data"
    before = shutil.disk_usage(data).free
    filled = await run_command(gateway, http, "s1", "head -c 64M /dev/zero > big; echo exit=$?; df -k . | tail -1")
    assert "No space left on device" in filled["stderr"], filled
    assert "exit=1" in filled["stdout"]
    assert shutil.disk_usage(data).free > before - 128 * 1024**2  # at most its quota (and metadata) of the host
    neighbour = await run_command(gateway, http, "s2", "head -c 8M /dev/zero > mine && wc -c < mine")
    assert neighbour["stdout"].strip() == str(8 * 1024**2), neighbour
    again = await run_command(gateway, http, "s1", "rm big && echo room > note && cat note")
    assert again["stdout"] == "room\n", again  # freeing its own space is enough
    assert mounts_under(data) == []  # the disks are mounted in the sandboxes' own namespaces, not the host's
    assert len(loops_under(data)) == 2
    assert gateway.control_address is not None
    for session in ("s1", "s2"):
        async with http.delete(f"http://127.0.0.1:{gateway.control_address[1]}/v1/sessions/{session}") as deleted:
            assert deleted.status in (200, 204)
    async with asyncio.timeout(10):  # the kernel frees a loop device once its namespace's last process is gone
        while loops_under(data):
            await asyncio.sleep(0.05)


def test_one_sandbox_holds_a_small_share_of_the_hosts_descriptors_and_the_cap_follows_memory():
    limits = Limits()
    file_max = int(Path("/proc/sys/fs/file-max").read_text())
    assert limits.processes * limits.open_files <= min(131_072, file_max // 8)  # was 512 x 4096: 2 million
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert host_sandbox_cap() == max(1, memory // (256 * 1024**2))


@pytest.fixture
async def cap_two(tmp_path: Path) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession]]:
    async for pair in start(tmp_path, local_max_sandboxes=2):
        yield pair


async def test_starts_at_the_same_moment_cannot_all_pass_the_cap(cap_two):
    gateway, http = cap_two
    results = await asyncio.gather(*(run(gateway, http, f"c{i}") for i in range(5)))
    assert sorted(status for status, _ in results) == [200, 200, 429, 429, 429], results
