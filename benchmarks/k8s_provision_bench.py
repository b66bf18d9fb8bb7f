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

``--scale`` measures the provider at load instead (issue #30): N sandboxes (100, then 400) provisioned
at once, then suspended and woken at once, each with and without injected throttling (a share of
the apiserver's non-watch answers is 429 with ``Retry-After``); per sandbox, the latency of
``ensure`` and of ``resume``, how many failed, the peak of open watches and of TCP connections at
the apiserver. ``--gateway-from PATH`` takes the ``gateway`` package from another checkout (e.g. a
worktree of ``main``: today's figures) while the fake apiserver and its faults come from this one.

    .venv/bin/python benchmarks/k8s_provision_bench.py --scale [--gateway-from /work/main]
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
if "--gateway-from" in sys.argv:  # the fake (and its faults) from here, the gateway from there
    import tests.fakekube.fixtures  # noqa: F401

    sys.path.insert(0, sys.argv[sys.argv.index("--gateway-from") + 1])

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


async def scale(n: int, throttled: bool, timeout: float) -> dict[str, float]:
    """One row of ``--scale``: n ensures at once, n suspends, n resumes at once (seconds, counts)."""
    from gateway.model import Owner, SandboxRequest
    from gateway.providers.kubernetes import KubernetesProvider
    from gateway.providers.kubernetes_options import KubernetesPoolOptions
    from routing import Isolation

    with tempfile.TemporaryDirectory() as tmp:
        kube = await start_fake_kube(Path(tmp), "v1.0", ready_delay=0.2)
        options = KubernetesPoolOptions(namespace="default", mode="sandbox", port=8888, pod_template=POD_TEMPLATE)
        provider = KubernetesProvider({"k8s": options}, "bench", api_client=await kube.api_client())
        await provider.start(lambda name: None)
        peak = {"watches": 0, "connections": 0}
        sampling = True

        async def sample() -> None:
            while sampling:
                peak["watches"] = max(peak["watches"], kube.server.open_watches)
                peak["connections"] = max(peak["connections"], kube.server.connections)
                await asyncio.sleep(0.01)

        def request(i: int) -> SandboxRequest:
            return SandboxRequest(f"ses-bench-{i}", "k8s", Isolation.PER_SESSION, Owner("acme", "u", None), f"s{i}",
                                  timeout)

        async def timed(call) -> float | None:  # noqa: ANN001
            began = time.perf_counter()
            try:
                await call
            except Exception:  # noqa: BLE001  (a failed request is counted, not raised)
                return None
            return time.perf_counter() - began

        if throttled:
            kube.server.faults.inject(status=429, retry_after=0.5, fraction=0.2, times=None, watch=False)
        sampler = asyncio.create_task(sample())
        try:
            provisions = await asyncio.gather(*(timed(provider.ensure(request(i))) for i in range(n)))
            kube.server.faults.clear()
            await asyncio.gather(*(provider.suspend(f"ses-bench-{i}", "k8s") for i in range(n)
                                   if provisions[i] is not None), return_exceptions=True)
            if throttled:
                kube.server.faults.inject(status=429, retry_after=0.5, fraction=0.2, times=None, watch=False)
            wakes = await asyncio.gather(*(timed(provider.resume(request(i))) for i in range(n)
                                           if provisions[i] is not None))
        finally:
            sampling = False
            await sampler
            await provider.close()
            await kube.close()

    def stats(values: list[float | None], prefix: str) -> dict[str, float]:
        ok = sorted(v for v in values if v is not None)
        if not ok:
            return {f"{prefix}_failed": len(values)}
        return {f"{prefix}_p50": ok[len(ok) // 2], f"{prefix}_p95": ok[min(len(ok) - 1, int(0.95 * len(ok)))],
                f"{prefix}_max": ok[-1], f"{prefix}_failed": len(values) - len(ok)}

    return {**stats(provisions, "provision"), **stats(wakes, "wake"), "watches": peak["watches"],
            "connections": peak["connections"]}


async def scale_table(sizes: list[int], timeout: float) -> None:
    print(f"Kubernetes provider at load (fake apiserver, controller ready after 200 ms, timeout {timeout:g}s; "
          "throttled: 20% of non-watch answers 429 + Retry-After 0.5 s)")
    print(f"{'n':>4} {'429s':>5} | {'provision p50/p95/max s':>24} {'failed':>6} | {'wake p50/p95/max s':>20} "
          f"{'failed':>6} | {'watches':>7} {'conns':>5}")
    for n in sizes:
        for throttled in (False, True):
            row = await scale(n, throttled, timeout)

            def cell(prefix: str) -> str:
                if f"{prefix}_p50" not in row:
                    return "-"
                return "/".join(f"{row[f'{prefix}_{k}']:.2f}" for k in ("p50", "p95", "max"))

            print(f"{n:>4} {'yes' if throttled else 'no':>5} | {cell('provision'):>24} "
                  f"{int(row['provision_failed']):>6} | {cell('wake'):>20} {int(row.get('wake_failed', 0)):>6} | "
                  f"{int(row['watches']):>7} {int(row['connections']):>5}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--scale", action="store_true", help="provision and wake latency at 100 and 400 at once")
    parser.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=[100, 400])
    parser.add_argument("--timeout", type=float, default=60.0, help="each provision's and wake's deadline")
    parser.add_argument("--gateway-from", help="a checkout whose gateway package to measure (default: this one)")
    args = parser.parse_args()
    from benchmarks.harness import reported

    with reported("k8s_provision_bench.py"):
        if args.scale:
            asyncio.run(scale_table(args.sizes, args.timeout))
        else:
            asyncio.run(main(args.n, args.concurrency))
