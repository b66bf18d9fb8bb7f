"""Wake latency: a request for a suspended sandbox, from sending it to its first proxied byte.

Drives a real ``sandbox-gateway serve`` process (memory store) for one pool per run:

- ``local``: the local provider (the runtime process is stopped on suspend and started again,
  confined as serve confines it, in the same directory);
- ``kubernetes``: the fake kube-apiserver and its simulated controller (tests/fakekube, in this
  process, ``--ready-delay`` for the pod to become ready), Sandbox v1beta1, through the real
  kubernetes_asyncio client; the "pods" are one reference runtime listening on 127.0.0.1..N
  (each resume's new pod IP) on one port.

Each sample: ``POST /v1/sandboxes/{id}/suspend`` on the control API (admin; waits until the
sandbox is suspended), then one GET through the data plane, timed to its first response byte.

The gateway's own share is the time not spent waiting on the provider:

- both pools: the same provider, built as serve builds it (``gateway.app.build_providers``,
  another data directory), is suspended and resumed directly in this process, interleaved sample
  by sample with the gateway's wakes: gateway share = median of (wake i through the gateway -
  wake i alone). Local wakes start a confined Python runtime (~0.5-1 s here), whose own spread
  hides a few milliseconds: the Kubernetes split below is the precise figure;
- kubernetes, also from the apiserver's own clock: provider share = from the PATCH that sets the
  Sandbox Running to the status with Ready=True and the new pod IP; the rest of the wake (request
  to PATCH, Ready to first byte) is the gateway's.

Goal (#15): the gateway adds under 10 ms p50 on top of the provider's readiness.

    .venv/bin/python benchmarks/wake_bench.py [--provider local|kubernetes|both] [--n 50] [--ready-delay 0.05]

Fails with a message naming the missing call when the gateway has no suspend API (the
suspend/wake core of #15 is not in this tree).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.app import build_providers  # noqa: E402
from gateway.model import Owner, SandboxRequest  # noqa: E402
from gateway.runtime import create_app  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from routing import Isolation, parse_policy, per_session_sandbox_id  # noqa: E402
from tests.fakekube.fixtures import FakeKube, start_fake_kube  # noqa: E402
from tests.gateway_process import GatewayProcess  # noqa: E402

POD_TEMPLATE = {"spec": {"containers": [{"name": "runtime", "image": "sandbox-runtime:latest"}]}}
HEADERS = {"X-User-Id": "bench", "X-Session-Id": "wake-bench"}
SANDBOX_ID = per_session_sandbox_id("wake-bench")


class MissingSuspendApi(SystemExit):
    pass


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def summary(label: str, values: list[float]) -> str:
    return f"  {label:<44} p50 {pct(values, 0.5):8.2f} ms   p99 {pct(values, 0.99):8.2f} ms"


async def suspend(http: aiohttp.ClientSession, control: str, sandbox_id: str) -> None:
    # force: the sample's own GET just ended, and an operator's suspend would wait activity_grace for it
    async with http.post(f"{control}/v1/sandboxes/{sandbox_id}/suspend?force=true") as response:
        body = await response.text()
        if response.status in (404, 405) and "sandbox" not in body.lower():
            raise MissingSuspendApi(
                f"the gateway answered {response.status} to POST /v1/sandboxes/{{id}}/suspend: it has no suspend "
                f"API (the suspend/wake core of #15 is not in this tree). Body: {body[:200]}")
        if response.status != 200 or '"suspended"' not in body:
            raise SystemExit(f"suspend answered {response.status}: {body[:300]}")


async def first_byte(http: aiohttp.ClientSession, data: str, sent: list[float] | None = None) -> float:
    started = time.perf_counter()
    if sent is not None:
        sent.append(started)
    async with http.get(f"{data}/", headers=HEADERS) as response:
        await response.content.read(1)
        took = time.perf_counter() - started
        await response.read()
        if response.status != 200:
            raise SystemExit(f"the wake request answered {response.status}")
    return took


class KubeClock:
    """When the apiserver stored the Sandbox's PATCH to Running and its next Ready=True with a pod IP."""

    def __init__(self, kube: FakeKube, name: str) -> None:
        self.name = name
        self.patched: list[float] = []
        self.ready: list[float] = []
        self.sent: list[float] = []  # when each wake request was sent (same clock)
        kube.server.store.subscribe(self._on_change)

    def _on_change(self, event: Any) -> None:
        obj, prev = event.obj or {}, event.prev or {}
        if obj.get("metadata", {}).get("name") != self.name or not event.resource.startswith("sandboxes"):
            return
        now = time.perf_counter()
        if obj.get("spec", {}).get("operatingMode") == "Running" and prev.get("spec", {}).get("operatingMode") == "Suspended":
            self.patched.append(now)
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in obj.get("status", {}).get("conditions") or ())
        if ready and obj.get("status", {}).get("podIPs") and len(self.ready) < len(self.patched):
            self.ready.append(now)


async def pods(tmp: Path, count: int) -> tuple[web.AppRunner, int]:
    """One runtime answering on 127.0.0.1..count, one port: every pod IP the resumes will hand out."""
    runner = web.AppRunner(create_app(tmp / "pvc", "pod"), access_log=None)
    await runner.setup()
    first = web.TCPSite(runner, "127.0.0.1", 0)
    await first.start()
    port = first._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    for n in range(2, count + 1):
        await web.TCPSite(runner, f"127.0.0.{n}", port).start()
    return runner, port


async def measure(provider: str, n: int, ready_delay: float, tmp: Path, env: dict[str, str],
                  cleanups: list[Callable[[], Awaitable[Any]]]) -> tuple[list[float], list[float], KubeClock | None]:
    """Start the parts (each registers its cleanup), then take n wakes through the gateway and n alone."""
    clock: KubeClock | None = None
    if provider == "kubernetes":
        kube = await start_fake_kube(tmp, ready_delay=ready_delay)
        cleanups.append(kube.close)
        runner, port = await pods(tmp, n + 2)  # each Sandbox's pods: 127.0.0.1, then one address up per resume
        cleanups.append(runner.cleanup)
        pool = {"provider": "kubernetes", "idle_timeout": "1h", "provisioning_timeout": 30,
                "kubernetes": {"mode": "sandbox", "port": port, "pod_template": POD_TEMPLATE}}
        env["SANDBOX_GATEWAY_KUBECONFIG"] = str(kube.kubeconfig_path)
        clock = KubeClock(kube, SANDBOX_ID)
    else:
        pool = {"provider": "local", "idle_timeout": "1h"}
    policy_file = tmp / "policy.yaml"
    policy_file.write_text(yaml.safe_dump({"pools": {"small": pool, "shared": pool},
                                           "routing": {"per_session_orgs": ["*"]}}))
    gateway = GatewayProcess(tmp / "gw", "--policy", str(policy_file), "--data-dir", str(tmp / "gw-data"),
                             env=env)
    await gateway.start()
    cleanups.append(gateway.stop)
    # The same provider alone, as serve builds it, for the baseline.
    settings = Settings(policy_file=policy_file, data_dir=tmp / "direct-data", installation="wake-bench-direct",
                        kubeconfig=env.get("SANDBOX_GATEWAY_KUBECONFIG"))
    policy = parse_policy(policy_file.read_text(), str(policy_file))
    direct = build_providers(settings, policy)
    await direct.start(lambda _name: None)
    cleanups.append(direct.close)
    baseline = SandboxRequest("ses-" + "0" * 48, "small", Isolation.PER_SESSION, Owner(None, "bench", None),
                              "direct", 60.0)
    through, alone, sent = [], [], []
    async with aiohttp.ClientSession() as http:
        await first_byte(http, gateway.data_url)  # creates the sandbox
        await direct.ensure(baseline)
        for _ in range(n):
            await suspend(http, gateway.control_url, SANDBOX_ID)
            through.append(await first_byte(http, gateway.data_url, sent))
            await direct.suspend(baseline.sandbox_id, baseline.pool)
            started = time.perf_counter()
            await direct.resume(baseline)
            alone.append(time.perf_counter() - started)
    if clock is not None:
        clock.sent = sent
    return through, alone, clock


async def run(provider: str, n: int, ready_delay: float) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cleanups: list[Callable[[], Awaitable[Any]]] = []
        env = {"SANDBOX_GATEWAY_ACCESS_LOG": "false", "SANDBOX_GATEWAY_INSTALLATION": "wake-bench"}
        try:
            through, alone, clock = await measure(provider, n, ready_delay, tmp, env, cleanups)
        finally:
            for cleanup in reversed(cleanups):
                await cleanup()

    print(f"\n{provider} provider, {n} wakes" + (f" (controller ready delay {ready_delay * 1000:g} ms)"
                                                if provider == "kubernetes" else "") + ":")
    print(summary("suspended -> first proxied byte (gateway)", through))
    print(summary("provider resume alone (baseline)", alone))
    paired = [t - a for t, a in zip(through, alone, strict=True)]  # wake i through the gateway - wake i alone
    spread = pct(alone, 0.75) - pct(alone, 0.25)
    print(f"  gateway share (p50 of paired differences):   {pct(paired, 0.5):8.2f} ms   "
          f"(the provider's own interquartile spread: {spread:.2f} ms; below it the share is noise)")
    if clock is not None and len(clock.ready) == n:
        waited = [r - p for p, r in zip(clock.patched, clock.ready, strict=True)]
        own = [t - w for t, w in zip(through, waited, strict=True)]
        print(summary("provider share (PATCH Running -> Ready+IP)", waited))
        print(summary("gateway share (the rest of each wake)", own))
        print(summary("  of which request -> PATCH Running", [p - t for t, p in zip(clock.sent, clock.patched)]))
        print(summary("  of which Ready+IP -> first byte", [t + d - r for t, d, r in
                                                            zip(clock.sent, through, clock.ready)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=("local", "kubernetes", "both"), default="both")
    parser.add_argument("--n", type=int, default=50, help="wakes per provider (default 50)")
    parser.add_argument("--ready-delay", type=float, default=0.05,
                        help="seconds the fake controller takes to make a resumed pod ready (default 0.05)")
    args = parser.parse_args()
    from benchmarks.harness import reported

    with reported("wake_bench.py"):
        for provider in ("local", "kubernetes") if args.provider == "both" else (args.provider,):
            asyncio.run(run(provider, args.n, args.ready_delay))


if __name__ == "__main__":
    main()
