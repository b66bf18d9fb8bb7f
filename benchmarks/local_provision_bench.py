"""How long a local sandbox takes from bind to ready (median and p90 of N).

Runs the real SessionRouter with the memory store and the local provider, so
each sample is: placement, reservation, spawning the runtime process, reading
its LISTENING line and answering its health check.

    .venv/bin/python benchmarks/local_provision_bench.py [--n 20] [--network none|outbound|both]

``--network outbound`` gives every sandbox its slirp4netns (pools.<name>.local.network);
``both`` alternates the two, sample by sample, so that they share the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.providers.base import PoolProviders
from gateway.providers.local import LocalProvider
from gateway.sessions import SessionRouter
from gateway.store.memory import MemoryStore
from routing import Identity, default_policy


async def main(n: int, networks: list[str]) -> None:
    samples: dict[str, list[float]] = {network: [] for network in networks}
    with tempfile.TemporaryDirectory() as tmp:
        # Org "iso" is per-session (ses- IDs, pool "small"), others share (pool "shared"): one pool per network.
        policy = default_policy(["iso"])
        pools = {network: name for network, name in zip(networks, ("small", "shared"), strict=False)}
        local = LocalProvider(Path(tmp), stop_on_close=True, networks={name: net for net, name in pools.items()})
        provider = PoolProviders({"small": local, "shared": local})
        router = SessionRouter(MemoryStore(), provider, policy, replica_id="bench")
        await provider.start(router.sandbox_lost)
        try:
            for i in range(n):
                for network in networks:
                    org = "iso" if pools[network] == "small" else f"org-{i}"
                    identity = Identity.parse(org_id=org, user_id="u", session_id=f"bench-{network}-{i}")
                    started = time.perf_counter()
                    await router.bind(identity)
                    samples[network].append(time.perf_counter() - started)
        finally:
            await provider.close()
    for network, taken in samples.items():
        taken.sort()
        print(f"local sandbox bind -> ready, network {network}, over {n} sequential binds:")
        print(f"  median {statistics.median(taken) * 1000:.0f} ms, p90 {taken[int(0.9 * (n - 1))] * 1000:.0f} ms, "
              f"min {taken[0] * 1000:.0f} ms, max {taken[-1] * 1000:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--network", choices=("none", "outbound", "both"), default="none")
    args = parser.parse_args()
    from benchmarks.harness import reported

    with reported("local_provision_bench.py"):
        asyncio.run(main(args.n, ["none", "outbound"] if args.network == "both" else [args.network]))
