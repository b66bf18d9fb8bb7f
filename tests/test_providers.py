"""The provider contract (tests/provider_contract.py) over every provider: local, static, Kubernetes.

- local: real ``python -m gateway.runtime`` processes, started through a small shell wrapper that
  can hold one sandbox before the runtime starts (a FIFO it reads) or refuse to start one;
- static: a fleet of one real reference runtime (an aiohttp test server);
- kubernetes: the fake apiserver and its controller, driven by the real kubernetes_asyncio client;
  the simulated pods' IP reaches a real reference runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from gateway.model import SandboxRequest
from gateway.providers.kubernetes import KubernetesProvider
from gateway.providers.confine import Unconfined
from gateway.providers.local import LocalProvider
from gateway.providers.static import StaticProvider
from gateway.runtime import create_app
from gateway.providers.kubernetes_options import KubernetesPoolOptions
from tests.provider_contract import POOL, LostReports, ProviderContract, ProviderHarness, request

# Runs the real runtime, except: a sandbox ID containing "held" waits for a line on its FIFO
# first (the test releases it); one containing "broken" exits without ever listening.
WRAPPER = """#!/bin/sh
case "$*" in
  *ses-broken*) echo "refusing to start" >&2; exit 1 ;;
  *ses-held*) read _ < "{fifo}" ;;
esac
exec {python} "$@"
"""

KUBE_POD_TEMPLATE = {"spec": {"containers": [{"name": "runtime", "image": "sandbox-runtime:latest"}]}}


@contextlib.asynccontextmanager
async def local_harness(tmp_path: Path) -> AsyncIterator[ProviderHarness]:
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(WRAPPER.format(fifo=fifo, python=sys.executable))
    wrapper.chmod(0o755)
    data = tmp_path / "data"
    started: list[LocalProvider] = []

    async def provider() -> LocalProvider:
        made = LocalProvider(data, stop_on_close=not started, confinement=Unconfined(str(wrapper)))
        await made.start(lost if not started else (lambda _sandbox_id: None))
        started.append(made)
        return made

    def state(sandbox_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((data / "sandboxes" / sandbox_id / "state.json").read_text())
        except FileNotFoundError:
            return None

    async def incarnation(sandbox_id: str) -> int | None:
        found = state(sandbox_id)
        return None if found is None else found["pid"]

    async def release(_sandbox_id: str) -> None:
        def write() -> None:
            with open(fifo, "w") as f:  # blocks until the held wrapper opens its end
                f.write("go\n")
        await asyncio.to_thread(write)

    async def no_op(_sandbox_id: str) -> None:
        return None

    async def lose(sandbox_id: str) -> None:
        found = state(sandbox_id)
        assert found is not None
        os.killpg(found["pid"], signal.SIGKILL)

    lost = LostReports()
    first = await provider()
    try:
        yield ProviderHarness(first, lost, incarnation, provider, first.ensure, hold=no_op, release=release, lose=lose)
    finally:
        for made in reversed(started):  # the first one stops every sandbox (stop_on_close)
            await made.close()


@contextlib.asynccontextmanager
async def static_harness(aiohttp_server, tmp_path: Path) -> AsyncIterator[ProviderHarness]:
    fleet = await aiohttp_server(create_app(tmp_path / "fleet", "fleet-host"))
    pools = {POOL: [f"http://127.0.0.1:{fleet.port}"]}
    lost = LostReports()

    async def provider() -> StaticProvider:
        made = StaticProvider(pools)
        await made.start(lost)
        return made

    first = await provider()

    async def incarnation(sandbox_id: str) -> str:
        return (await first.ensure(request(sandbox_id))).url()

    async def cannot_start(broken: SandboxRequest) -> object:
        return await first.ensure(request(broken.sandbox_id, pool="no-such-pool"))

    fixed = "a static pool is a fixed fleet: nothing is created, destroyed or watched"
    try:
        yield ProviderHarness(first, lost, incarnation, provider, cannot_start,
                              creates=False, creates_reason=fixed, holds_readiness=False, holds_reason=fixed,
                              reports_lost=False, lost_reason=fixed)
    finally:
        await first.close()


@contextlib.asynccontextmanager
async def kubernetes_harness(make_fake_kube, aiohttp_server, tmp_path: Path) -> AsyncIterator[ProviderHarness]:
    runtime = await aiohttp_server(create_app(tmp_path / "pod", "k8s-pod"))
    kube = await make_fake_kube()
    options = KubernetesPoolOptions(namespace="default", api_version="v1beta1", mode="sandbox", port=runtime.port,
                                    pod_template=KUBE_POD_TEMPLATE)
    lost = LostReports()
    started: list[KubernetesProvider] = []

    async def provider() -> KubernetesProvider:
        made = KubernetesProvider({POOL: options}, "contract", api_client=await kube.api_client())
        await made.start(lost if not started else (lambda _sandbox_id: None))
        started.append(made)
        return made

    async def incarnation(sandbox_id: str) -> str | None:
        obj = kube.server.get_object("sandboxes", "default", sandbox_id)
        return None if obj is None else obj["metadata"]["uid"]

    async def hold(_sandbox_id: str) -> None:
        kube.controller.pause()

    async def release(_sandbox_id: str) -> None:
        kube.controller.resume()

    async def cannot_start(broken: SandboxRequest) -> object:
        pending = asyncio.create_task(first.ensure(broken))
        await kube.server.wait_for_object("sandboxes", "default", broken.sandbox_id)
        kube.controller.fail(broken.sandbox_id, reason="PodFailed", message="image pull backoff")
        return await pending

    async def lose(sandbox_id: str) -> None:  # deleted behind our back (by hand, or by its shutdownTime)
        api = client.CustomObjectsApi(await kube.api_client())
        await api.delete_namespaced_custom_object("agents.x-k8s.io", "v1beta1", "default", "sandboxes", sandbox_id)

    first = await provider()
    try:
        yield ProviderHarness(first, lost, incarnation, provider, cannot_start, hold=hold, release=release, lose=lose)
    finally:
        for made in started:
            await made.close()


@pytest.fixture(params=["local", "static", "kubernetes"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path, aiohttp_server,
                  make_fake_kube) -> AsyncIterator[ProviderHarness]:
    if request.param == "local":
        made = local_harness(tmp_path)
    elif request.param == "static":
        made = static_harness(aiohttp_server, tmp_path)
    else:
        made = kubernetes_harness(make_fake_kube, aiohttp_server, tmp_path)
    async with made as built:
        yield built


class TestProviders(ProviderContract):
    pass
