"""How long a local sandbox takes from bind to ready (median and p90 of N).

Runs the real SessionRouter with the memory store and the local provider, so
each sample is: placement, reservation, spawning the runtime process, reading
its LISTENING line and answering its health check.

    .venv/bin/python benchmarks/local_provision_bench.py [--n 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from gateway.providers.base import PoolProviders
from gateway.providers.local import LocalProvider
from gateway.sessions import SessionRouter
from gateway.store.memory import MemoryStore
from routing import Identity, default_policy


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalProvider(Path(tmp), stop_on_close=True)
        provider = PoolProviders({"small": local, "shared": local})
        router = SessionRouter(MemoryStore(), provider, default_policy(["*"]), replica_id="bench")
        await provider.start(router.sandbox_lost)
        samples = []
        try:
            for i in range(n):
                started = time.perf_counter()
                await router.bind(Identity.parse(user_id="u", session_id=f"bench-{i}"))
                samples.append(time.perf_counter() - started)
        finally:
            await provider.close()
    samples.sort()
    print(f"local sandbox bind -> ready over {n} sequential binds:")
    print(f"  median {statistics.median(samples) * 1000:.0f} ms, "
          f"p90 {samples[int(0.9 * (n - 1))] * 1000:.0f} ms, min {samples[0] * 1000:.0f} ms, max {samples[-1] * 1000:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    asyncio.run(main(parser.parse_args().n))
