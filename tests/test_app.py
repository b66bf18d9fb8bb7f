"""The composition root in-process: start and stop."""

from __future__ import annotations

import asyncio

import pytest

from gateway.app import Gateway
from gateway.metrics import Metrics
from gateway.model import Binding, Endpoint, Owner, SandboxRecord, SandboxState
from gateway.providers.base import PoolProviders
from gateway.settings import Settings
from gateway.store.base import Caps
from gateway.store.memory import MemoryStore
from routing import Isolation, default_policy
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


# --------------------------------------------------------------------------------------
# Teardown mirrors setup and survives failures (hand-written fakes, a real data plane)
# --------------------------------------------------------------------------------------


class StopFailed(Exception):
    pass


class FakeProvider:
    """A provider that records its start and close into ``events``; its close may raise."""

    def __init__(self, events: list[str], *, close_raises: bool = False) -> None:
        self.events = events
        self.close_raises = close_raises

    async def start(self, on_lost) -> None:
        self.events.append("provider started")

    async def close(self) -> None:
        self.events.append("provider closed")
        if self.close_raises:
            raise StopFailed("the provider's client would not close")

    async def ensure(self, request):
        raise AssertionError("no sandbox is created in these tests")

    async def delete(self, sandbox_id: str, pool: str) -> None: ...

    async def list_managed(self) -> list:
        return []

    def describe(self) -> list[str]:
        return ["fake"]


class RecordingStore(MemoryStore):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    async def close(self) -> None:
        self.events.append("store closed")
        await super().close()


def fake_gateway(tmp_path, events: list[str], **provider) -> Gateway:
    settings = Settings(data_dir=tmp_path / "data", drain_timeout=0)
    fake = FakeProvider(events, **provider)
    policy = default_policy()
    return Gateway(settings, policy, RecordingStore(events), PoolProviders({name: fake for name in policy.pools}), Metrics())


async def refuses_connections(address: tuple[str, int]) -> bool:
    try:
        _, writer = await asyncio.open_connection(*address)
    except OSError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


async def test_a_provider_whose_close_raises_still_gets_the_store_closed(tmp_path):
    events: list[str] = []
    gateway = fake_gateway(tmp_path, events, close_raises=True)
    await gateway.start(listening_socket(), listening_socket())
    assert gateway.data_address is not None and gateway.control_address is not None
    with pytest.raises(StopFailed):
        await gateway.stop()
    assert events == ["provider started", "provider closed", "store closed"]
    assert all(task.done() for task in gateway._tasks)
    assert await refuses_connections(gateway.data_address)
    assert await refuses_connections(gateway.control_address)


async def test_a_failure_midway_through_start_unwinds_what_was_started(tmp_path):
    """The control socket is unusable: the provider (its watches), the background loops and the data
    plane, all started before it, are stopped again, and the store closed."""
    events: list[str] = []
    gateway = fake_gateway(tmp_path, events)
    data_sock, control_sock = listening_socket(), listening_socket()
    data_address = data_sock.getsockname()[:2]
    control_sock.close()
    with pytest.raises(OSError):
        await gateway.start(data_sock, control_sock)
    assert events == ["provider started", "provider closed", "store closed"]
    assert gateway._tasks and all(task.done() for task in gateway._tasks)
    assert await refuses_connections(data_address)
    await gateway.stop()  # nothing left to undo: a second teardown closes nothing twice
    assert events == ["provider started", "provider closed", "store closed"]


async def test_stop_without_start_closes_the_store_only(tmp_path):
    events: list[str] = []
    await fake_gateway(tmp_path, events).stop()
    assert events == ["store closed"]


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
