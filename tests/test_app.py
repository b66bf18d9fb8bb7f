"""The composition root in-process: start and stop."""

from __future__ import annotations

import asyncio

from gateway.app import Gateway
from gateway.settings import Settings
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
