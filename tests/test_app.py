"""The composition root in-process: start and stop."""

from __future__ import annotations

import asyncio

from gateway.app import Gateway
from gateway.model import Binding, Endpoint, Owner, SandboxRecord, SandboxState
from gateway.settings import Settings
from gateway.store.base import Caps
from routing import Isolation
from tests.proxy_helpers import listening_socket


async def test_stop_ends_a_background_loop_whose_job_swallowed_the_cancel(tmp_path):
    """redis-py can swallow a cancellation when a reply lands at the same moment: the loop must end
    anyway, and stop() must return instead of waiting on it forever."""
    gateway = Gateway.create(Settings(data_dir=tmp_path / "data"))
    await gateway.start(listening_socket(), listening_socket())
    entered = asyncio.Event()

    async def swallowing_job() -> None:
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # the bug being defended against

    gateway._every(0.001, swallowing_job)
    await asyncio.wait_for(entered.wait(), 5)
    loop_task = gateway._tasks[-1]
    await asyncio.wait_for(gateway.stop(), 4)  # under STOP_TASKS_TIMEOUT: the loop itself ended
    assert loop_task.done()


async def test_gauges_come_from_the_stores_counts(tmp_path):
    """The sandbox and session gauges read counts the store keeps as it changes (no listing)."""
    gateway = Gateway.create(Settings(data_dir=tmp_path / "data"))
    await gateway.start(listening_socket(), listening_socket())
    try:
        store, owner = gateway.store, Owner("acme", "alice", None)
        for sandbox_id in ("ses-a", "ses-b"):
            await store.reserve_sandbox(SandboxRecord(sandbox_id, "small", "acme", SandboxState.CREATING,
                                                      created_at=1.0, owner=owner), Caps(), 60)
            await store.put_binding(Binding(sandbox_id, sandbox_id, "small", Isolation.PER_SESSION, owner, 1.0))
        await store.mark_ready("ses-a", Endpoint("127.0.0.1", 9))
        await gateway._refresh_gauges()
        text = gateway.metrics.exposition()[0].decode()
        assert 'sgw_sandboxes{pool="small",state="ready"} 1.0' in text
        assert 'sgw_sandboxes{pool="small",state="creating"} 1.0' in text
        assert 'sgw_sandboxes{pool="shared",state="ready"} 0.0' in text
        assert 'sgw_sessions{pool="small"} 2.0' in text
    finally:
        await gateway.stop()
