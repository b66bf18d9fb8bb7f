"""The cyclic GC while serving (gateway/collector.py): thresholds, and young collections paced by the clock."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gateway.collector import MIDDLE_EVERY, PacedCollections, tune_gc


@contextmanager
def collections_seen() -> Iterator[list[tuple[int, int]]]:
    """(generation, objects in the generations collected) of every collection while the block runs."""
    seen: list[tuple[int, int]] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            generation = info["generation"]
            seen.append((generation, sum(len(gc.get_objects(g)) for g in range(generation + 1))))

    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)


def test_serving_collects_the_middle_generation_often_and_the_full_one_rarely() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (before[0], 3, 3_000)
    finally:
        gc.set_threshold(*before)


async def test_a_connection_churn_is_collected_young_by_the_clock() -> None:
    """A churn of connections frees as many tracked objects as it makes, so CPython's count of the young
    generation stands still and the young objects pile up until something else moves it (15,000-35,000 under
    grpc-idle). Paced, a young collection comes every ``every`` seconds, a middle one every MIDDLE_EVERY of
    them, and none walks more than what the churn made since the one before. Real loopback connections,
    each kept a while (as an attack's are) and then closed."""
    loop = asyncio.get_running_loop()
    kept: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kept.append((reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    before = gc.get_threshold()
    gc.set_threshold(100_000)  # CPython's own trigger out of the way: what collects here is the clock
    paced = PacedCollections(loop, every=0.01)
    try:
        with collections_seen() as seen:
            paced.start()
            for _ in range(10):
                for _ in range(30):
                    sock = socket.create_connection(("127.0.0.1", port))
                    sock.close()
                await asyncio.sleep(0.02)
                for _, writer in kept[:-30]:  # the older ones go, the newest stay a round
                    writer.close()
                del kept[:-30]
        paced.stop()
        runs = paced.runs
        assert runs >= 5 and len(seen) >= runs  # a collection per run (and any of the test's own)
        assert sum(1 for generation, _ in seen if generation >= 1) >= runs // MIDDLE_EVERY
        assert max(objects for _, objects in seen) < 20_000  # bounded by the churn between runs
    finally:
        paced.stop()
        gc.set_threshold(*before)
        for _, writer in kept:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_stopped_it_collects_no_more() -> None:
    """Runs until stopped (the first run awaited, not slept for), then no more: the absence of a run can
    only be shown by waiting, so the wait after stop is three of its periods."""
    loop = asyncio.get_running_loop()
    paced = PacedCollections(loop, every=0.005)
    ran = asyncio.Event()
    collect = paced._collect

    def counted() -> None:
        collect()
        ran.set()

    paced._collect = counted  # type: ignore[method-assign]
    paced.start()
    await asyncio.wait_for(ran.wait(), 5)
    paced.stop()
    runs = paced.runs
    assert runs >= 1
    await asyncio.sleep(3 * paced.every)
    assert paced.runs == runs
