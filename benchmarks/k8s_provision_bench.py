"""Provisioning overhead on Kubernetes: from the controller's Ready update to the first proxied byte.

Runs the fake kube-apiserver and its simulated controller (tests/fakekube), a
reference runtime as the "pod", and a full in-process Gateway (memory store,
Kubernetes provider through the real kubernetes_asyncio client, the data plane).
For each of N new sessions it sends one request through the data plane and
measures, on one monotonic clock, the time from the apiserver storing the
Sandbox's ``Ready=True`` status to the client receiving the first response byte:
everything the gateway adds once the sandbox is actually ready (watch event
delivery, endpoint extraction, store update, connect, forward, response).

    .venv/bin/python benchmarks/k8s_provision_bench.py [--n 200] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.app import Gateway  # noqa: E402
from gateway.runtime import create_app  # noqa: E402
from gateway.server import bind  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from routing import per_session_sandbox_id  # noqa: E402
from tests.fakekube.fixtures import start_fake_kube  # noqa: E402

POD_TEMPLATE = {"spec": {"containers": [{"name": "runtime", "image": "sandbox-runtime:latest"}]}}


async def main(n: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        runtime = web.AppRunner(create_app(tmp_path / "pod", "pod"), access_log=None)
        await runtime.setup()
        site = web.TCPSite(runtime, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        kube = await start_fake_kube(tmp_path, "head", ready_delay=0.005)
        ready_at: dict[str, float] = {}

        def on_change(event) -> None:  # noqa: ANN001
            status = event.obj.get("status") or {}
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()):
                ready_at.setdefault(event.obj["metadata"]["name"], time.perf_counter())

        kube.server.store.subscribe(on_change)
        pool = {"provider": "kubernetes", "provisioning_timeout": 30,
                "kubernetes": {"namespace": "default", "api_version": "v1beta1", "mode": "sandbox", "port": port,
                               "pod_template": POD_TEMPLATE}}
        policy = tmp_path / "policy.yaml"
        policy.write_text(yaml.safe_dump({"pools": {"small": pool, "shared": pool},
                                          "routing": {"per_session_orgs": ["*"]}}))
        settings = Settings(policy_file=policy, kubeconfig=str(kube.kubeconfig_path), access_log=False,
                            data_dir=tmp_path / "data", installation="bench", log_level="warning")
        gateway = Gateway.create(settings)
        await gateway.start(bind("127.0.0.1", 0, listen=True), bind("127.0.0.1", 0, listen=True))
        host, data_port = gateway.data_address  # type: ignore[misc]
        overheads: list[float] = []
        totals: list[float] = []
        limit = asyncio.Semaphore(concurrency)

        async def one(http: aiohttp.ClientSession, i: int) -> None:
            async with limit:
                hdrs = {"X-User-Id": "u", "X-Session-Id": f"bench-{i}"}
                started = time.perf_counter()
                async with http.get(f"http://{host}:{data_port}/", headers=hdrs) as response:
                    await response.content.read(1)
                    first_byte = time.perf_counter()
                    await response.read()
                    assert response.status == 200
                overheads.append(first_byte - ready_at[per_session_sandbox_id(hdrs["X-Session-Id"])])
                totals.append(first_byte - started)

        try:
            async with aiohttp.ClientSession() as http:
                await asyncio.gather(*(one(http, i) for i in range(n)))
        finally:
            await gateway.stop()
            await kube.close()
            await runtime.cleanup()

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    print(f"Kubernetes provisioning through the gateway, {n} sandboxes, concurrency {concurrency}:")
    print(f"  Ready update -> first proxied byte: p50 {statistics.median(overheads) * 1000:.2f} ms, "
          f"p99 {pct(overheads, 0.99):.2f} ms, max {max(overheads) * 1000:.2f} ms")
    print(f"  request -> first byte (incl. controller delay 5 ms): p50 {statistics.median(totals) * 1000:.1f} ms, "
          f"p99 {pct(totals, 0.99):.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    from benchmarks.harness import reported

    with reported("k8s_provision_bench.py"):
        asyncio.run(main(args.n, args.concurrency))
