"""Suspend and resume on the Kubernetes provider, against the fake kube-apiserver through the real
kubernetes_asyncio client: operatingMode (v1beta1) or replicas (v1alpha1) on the Sandbox, or on the
Sandbox a claim holds; readiness by watch; a new pod IP after each resume."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client

from gateway.errors import ProvisionFailed, ProvisionTimeout
from gateway.model import Owner, SandboxRequest
from gateway.providers.base import ForeignSandbox
from gateway.providers.kubernetes import KubernetesProvider
from gateway.runtime import create_app
from gateway.sessions import SessionRouter
from routing import Identity, Isolation
from tests.fakekube.fixtures import FakeKube
from tests.test_kubernetes import VERSIONS, pool_options, request, routed, seed_templates

SBX = "agents.x-k8s.io"


@pytest.fixture
async def runtime_port(aiohttp_server, tmp_path: Path) -> int:
    """The reference runtime at 127.0.0.1 and 127.0.0.2 on one port over one directory: the first pod's
    IP and the resumed pod's, sharing their files as a Sandbox's PVC outlives its pods. The port the
    kernel gave the first may be in use on 127.0.0.2 (another test's socket): then both are tried again."""
    for _ in range(20):
        first = await aiohttp_server(create_app(tmp_path / "pvc", "k8s-pod"), host="127.0.0.1")
        try:
            await aiohttp_server(create_app(tmp_path / "pvc", "k8s-pod"), host="127.0.0.2", port=first.port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            await first.close()
            continue
        return first.port
    raise AssertionError("no port was free on both 127.0.0.1 and 127.0.0.2 in 20 tries")


async def started(kube: FakeKube, mode: str, api_version: str, port: int) -> KubernetesProvider:
    provider = KubernetesProvider({"k8s": pool_options(mode, api_version, port)}, "test",
                                  api_client=await kube.api_client())
    lost: list[str] = []
    gone = asyncio.Event()
    provider.lost, provider.gone = lost, gone  # type: ignore[attr-defined]  # test bookkeeping
    await provider.start(lambda name: (lost.append(name), gone.set()))
    return provider


def sandbox_of(kube: FakeKube, mode: str, sandbox_id: str) -> dict:
    """The Sandbox object behind a sandbox ID (a claim's: the one its status names)."""
    name = sandbox_id
    if mode == "claim":
        claim = kube.server.get_object("sandboxclaims", "default", sandbox_id)
        name = claim["status"]["sandbox"]["name"]
    return kube.server.get_object("sandboxes", "default", name)


def spec_suspended(obj: dict) -> bool:
    return obj["spec"].get("operatingMode") == "Suspended" or obj["spec"].get("replicas") == 0


@pytest.mark.parametrize(("crd_set", "api_version"), VERSIONS)
@pytest.mark.parametrize("mode", ["sandbox", "claim"])
async def test_suspend_then_resume_serves_the_same_files_at_a_new_pod_ip(make_fake_kube, runtime_port, crd_set,
                                                                         api_version, mode):
    kube = await make_fake_kube(crd_set)
    await seed_templates(kube, api_version)
    provider = await started(kube, mode, api_version, runtime_port)
    try:
        first = await provider.ensure(request("ses-nap", timeout=10))
        assert first.host == "127.0.0.1"
        async with aiohttp.ClientSession() as http:
            form = aiohttp.FormData()
            form.add_field("file", b"kept", filename="note.txt")
            async with http.post(f"{first.url()}/upload", data=form) as r:
                assert r.status == 200, await r.text()
            name = sandbox_of(kube, mode, "ses-nap")["metadata"]["name"]

            for _ in range(2):  # idempotent: a second suspend finds it suspended
                await provider.suspend("ses-nap", "k8s")
                box = sandbox_of(kube, mode, "ses-nap")
                assert spec_suspended(box) and not box["status"].get("podIPs")
                assert kube.server.get_object("pods", "default", name) is None  # the pod is gone

            woken = await provider.resume(request("ses-nap"))
            assert woken.host == "127.0.0.2" and woken.port == runtime_port  # a new pod, a new IP
            assert await provider.resume(request("ses-nap")) == woken  # idempotent: running already
            assert not spec_suspended(sandbox_of(kube, mode, "ses-nap"))
            async with http.get(f"{woken.url()}/download/note.txt") as r:
                assert r.status == 200 and await r.read() == b"kept"
        # Suspending is not losing: after the suspend and the resume, a real loss is the first one the
        # managed watch reports (its stream is ordered). A claim's Ready mirrors its Sandbox's, so a claim
        # pool reports the suspend too (the router ignores a loss for a sandbox that is not READY).
        kube.controller.lose_pod(name)
        await asyncio.wait_for(provider.gone.wait(), 10)
        if mode == "sandbox":
            assert provider.lost == ["ses-nap"]
        assert provider.can_suspend("k8s")
    finally:
        await provider.close()


@pytest.mark.parametrize("mode", ["sandbox", "claim"])
async def test_an_object_deleted_while_suspended_is_created_anew_on_resume(make_fake_kube, runtime_port, mode):
    kube = await make_fake_kube()
    await seed_templates(kube, "v1beta1")
    provider = await started(kube, mode, "v1beta1", runtime_port)
    plural = "sandboxclaims" if mode == "claim" else "sandboxes"
    group = "extensions.agents.x-k8s.io" if mode == "claim" else SBX
    try:
        await provider.ensure(request("ses-del"))
        await provider.suspend("ses-del", "k8s")
        api = client.CustomObjectsApi(await kube.api_client())
        await api.delete_namespaced_custom_object(group, "v1beta1", "default", plural, "ses-del")
        await provider.suspend("ses-del", "k8s")  # nothing there: nothing to suspend
        endpoint = await provider.resume(request("ses-del"))
        assert endpoint.port == runtime_port
        assert kube.server.create_count(plural, "default", "ses-del") == 2
    finally:
        await provider.close()


async def test_a_pod_that_fails_on_resume_fails_fast_and_keeps_the_object(make_fake_kube, runtime_port):
    kube = await make_fake_kube()
    provider = await started(kube, "sandbox", "v1beta1", runtime_port)
    try:
        await provider.ensure(request("ses-bad"))
        await provider.suspend("ses-bad", "k8s")
        kube.controller.fail("ses-bad", reason="PodFailed", message="image pull backoff")
        with pytest.raises(ProvisionFailed) as info:
            await provider.resume(request("ses-bad", timeout=30))
        assert "PodFailed" in info.value.message and "image pull backoff" in info.value.message
        assert kube.server.get_object("sandboxes", "default", "ses-bad") is not None  # its files are kept
    finally:
        await provider.close()


async def test_a_resume_past_its_budget_times_out_and_a_later_one_succeeds(make_fake_kube, runtime_port):
    kube = await make_fake_kube()
    provider = await started(kube, "sandbox", "v1beta1", runtime_port)
    try:
        await provider.ensure(request("ses-slow"))
        await provider.suspend("ses-slow", "k8s")
        kube.controller.pause()
        with pytest.raises(ProvisionTimeout) as info:
            await provider.resume(request("ses-slow", timeout=1.5))  # the patch itself is within the budget
        assert info.value.status == 504 and "resuming" in info.value.message
        assert not spec_suspended(kube.server.get_object("sandboxes", "default", "ses-slow"))  # set to run, kept
        kube.controller.resume()
        assert (await provider.resume(request("ses-slow"))).host == "127.0.0.2"
    finally:
        await provider.close()


async def test_resume_never_wakes_another_owners_sandbox(make_fake_kube, runtime_port):
    kube = await make_fake_kube()
    provider = await started(kube, "sandbox", "v1beta1", runtime_port)
    try:
        await provider.ensure(request("ses-own"))
        await provider.suspend("ses-own", "k8s")
        mallory = SandboxRequest("ses-own", "k8s", Isolation.PER_SESSION, Owner("evil", "mallory", None), "sess-1", 5)
        with pytest.raises(ForeignSandbox):
            await provider.resume(mallory)
        assert spec_suspended(kube.server.get_object("sandboxes", "default", "ses-own"))  # still asleep
    finally:
        await provider.close()


@pytest.mark.skipif(not hasattr(SessionRouter, "suspend_sandbox"),
                    reason="the suspend/wake core of #15 (branch suspend) is not merged in this tree")
@pytest.mark.parametrize("mode", ["sandbox", "claim"])
async def test_the_router_wakes_a_suspended_kubernetes_sandbox_once_with_its_files(make_fake_kube, runtime_port, mode):
    """Through SessionRouter: the operator suspends, 20 concurrent resolves wake it with one new pod,
    all at the new pod IP, and the file written before the suspend is there."""
    kube = await make_fake_kube()
    await seed_templates(kube, "v1beta1")
    provider, router = await routed(kube, pool_options(mode, "v1beta1", runtime_port))
    identity = Identity.parse(org_id="acme", user_id="alice", session_id="s-wake")
    try:
        route = await router.resolve(identity)
        async with aiohttp.ClientSession() as http:
            form = aiohttp.FormData()
            form.add_field("file", b"kept", filename="note.txt")
            async with http.post(f"{route.endpoint.url()}/upload", data=form) as r:
                assert r.status == 200
            name = sandbox_of(kube, mode, route.sandbox_id)["metadata"]["name"]
            record = await router.suspend_sandbox(route.sandbox_id)
            assert record.state.value == "suspended"
            assert kube.server.get_object("pods", "default", name) is None
            woken = await asyncio.gather(*(router.resolve(identity) for _ in range(20)))
            assert {w.endpoint.host for w in woken} == {"127.0.0.2"}  # one resume: one new pod
            assert kube.server.create_count("pods", "default", name) == 2
            async with http.get(f"{woken[0].endpoint.url()}/download/note.txt") as r:
                assert r.status == 200 and await r.read() == b"kept"
    finally:
        await provider.close()
