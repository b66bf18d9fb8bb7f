"""The Kubernetes provider against the fake kube-apiserver, via the real kubernetes_asyncio client."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gateway.compat_locator import KubernetesSandboxLocator
from gateway.errors import Conflict, KubeApiError, NotFound, ProvisionFailed, ProvisionTimeout
from gateway.model import Owner, SandboxRequest
from gateway.providers.base import PoolProviders, Probe
from gateway.providers.kubernetes import KubernetesProvider
from gateway.providers.kubernetes_api import INSTALLATION, ObjectExists, ObjectMissing, WatchExpired, translated
from gateway.providers.kubernetes_options import KubernetesPoolOptions
from gateway.runtime import create_app
from gateway.sessions import RouterTuning, SessionRouter
from gateway.settings import Settings
from gateway.store.memory import MemoryStore
from routing import Identity, Isolation, parse_policy
from tests.fakekube.fixtures import FakeKube

POD_TEMPLATE = {"spec": {"containers": [{"name": "runtime", "image": "sandbox-runtime:latest"}]}}
TEMPLATE_BODY = {"podTemplate": POD_TEMPLATE}


@pytest.fixture
async def runtime_port(aiohttp_server, tmp_path: Path) -> int:
    """A real reference runtime: the simulated pods' IP (127.0.0.1) and this port reach it."""
    server = await aiohttp_server(create_app(tmp_path / "pod", "k8s-pod"))
    return server.port


def pool_options(mode: str, api_version: str | None, port: int, **extra) -> KubernetesPoolOptions:
    """A pool's options; ``api_version=None`` leaves it out, as a policy that does not say."""
    fields = {"namespace": "default", "mode": mode, "port": port, **extra}
    if api_version is not None:
        fields["api_version"] = api_version
    if mode == "sandbox":
        fields["pod_template"] = POD_TEMPLATE
    elif api_version == "v1alpha1":
        fields["template"] = "tmpl"
    else:
        fields["warm_pool"] = "warm"
    return KubernetesPoolOptions.model_validate(fields)


async def seed_templates(kube: FakeKube, api_version: str, warm_replicas: int = 2) -> None:
    api = client.CustomObjectsApi(await kube.api_client())
    group = "extensions.agents.x-k8s.io"
    await api.create_namespaced_custom_object(group, api_version, "default", "sandboxtemplates", {
        "apiVersion": f"{group}/{api_version}", "kind": "SandboxTemplate",
        "metadata": {"name": "tmpl"}, "spec": TEMPLATE_BODY})
    if api_version == "v1beta1":
        await api.create_namespaced_custom_object(group, api_version, "default", "sandboxwarmpools", {
            "apiVersion": f"{group}/{api_version}", "kind": "SandboxWarmPool",
            "metadata": {"name": "warm"}, "spec": {"replicas": warm_replicas, "sandboxTemplateRef": {"name": "tmpl"}}})


def request(sandbox_id: str, pool: str = "k8s", timeout: float = 10.0) -> SandboxRequest:
    return SandboxRequest(sandbox_id, pool, Isolation.PER_SESSION, Owner("acme", "alice", None), "sess-1", timeout)


async def started(kube: FakeKube, options: KubernetesPoolOptions, installation: str = "test") -> KubernetesProvider:
    # The same pool options under every pool name the tests' policies use.
    pools = {"k8s": options, "small": options, "shared": options}
    provider = KubernetesProvider(pools, installation, api_client=await kube.api_client())
    lost: list[str] = []
    provider.lost = lost  # type: ignore[attr-defined]  # test bookkeeping
    await provider.start(lost.append)
    return provider


PER_SESSION = parse_policy("pools: {small: {}, shared: {}}\nrouting: {per_session_orgs: ['*']}", "t")


async def routed(kube: FakeKube, options: KubernetesPoolOptions) -> tuple[KubernetesProvider, SessionRouter]:
    """A provider whose lost sandboxes are reported to a router on a memory store."""
    provider = KubernetesProvider({"k8s": options, "small": options, "shared": options}, "test",
                                  api_client=await kube.api_client())
    router = SessionRouter(MemoryStore(), PoolProviders({"small": provider, "shared": provider}), PER_SESSION,
                           replica_id="r")
    await provider.start(router.sandbox_lost)
    return provider, router


# agent-sandbox v1.0 (v1beta1 only, the default), the v0.5 line (both versions served, v1alpha1
# converted) and v0.4.6 (v1alpha1 only).
VERSIONS = [pytest.param("v1.0", "v1beta1", id="v1.0-v1beta1"), pytest.param("head", "v1alpha1", id="v0.5-v1alpha1"),
            pytest.param("v0.4.6", "v1alpha1", id="v0.4.6-v1alpha1")]


@pytest.mark.parametrize(("crd_set", "api_version"), VERSIONS)
@pytest.mark.parametrize("mode", ["sandbox", "claim"])
async def test_session_end_to_end(make_fake_kube, runtime_port, crd_set, api_version, mode):
    kube = await make_fake_kube(crd_set)
    await seed_templates(kube, api_version)
    provider, router = await routed(kube, pool_options(mode, api_version, runtime_port))
    try:
        route = await router.resolve(Identity.parse(org_id="acme", user_id="alice", session_id="s1"))
        assert route.endpoint.host == "127.0.0.1" and route.endpoint.port == runtime_port
        async with aiohttp.ClientSession() as http, http.get(f"{route.endpoint.url()}/") as response:
            assert (await response.json())["status"] == "ok"
        managed = await provider.list_managed()
        assert [m.sandbox_id for m in managed] == [route.sandbox_id]
        kind = "sandboxclaims" if mode == "claim" else "sandboxes"
        obj = kube.server.get_object(kind, "default", route.sandbox_id)
        assert obj["metadata"]["labels"][INSTALLATION] == "test"
        assert obj["metadata"]["annotations"]["sandbox-gateway.io/session-id"] == "s1"
        # Accepted by that version's schema with no field pruned.
        assert [(c.version, c.warnings) for c in kube.server.create_calls
                if c.name == route.sandbox_id and c.actor == "client"] == [(api_version, ())]
    finally:
        await provider.close()


@pytest.mark.parametrize("reason", ["PodFailed", "TemplateNotFound", "ReconcilerError"])
async def test_terminal_failure_fails_fast_and_leaves_nothing(make_fake_kube, runtime_port, reason):
    kube = await make_fake_kube(ready_delay=30)
    provider = await started(kube, pool_options("sandbox", "v1beta1", runtime_port))
    try:
        pending = asyncio.create_task(provider.ensure(request("ses-fail")))
        await kube.server.wait_for_object("sandboxes", "default", "ses-fail")
        kube.controller.fail("ses-fail", reason=reason, message="image pull backoff")
        with pytest.raises(ProvisionFailed) as info:
            await pending
        assert reason in info.value.message and "image pull backoff" in info.value.message
        assert await provider.list_managed() == []
    finally:
        await provider.close()


async def test_provisioning_timeout_deletes_the_object(make_fake_kube, runtime_port):
    kube = await make_fake_kube(ready_delay=60)
    provider = await started(kube, pool_options("sandbox", "v1beta1", runtime_port))
    try:
        with pytest.raises(ProvisionTimeout) as info:
            await provider.ensure(request("ses-slow", timeout=0.3))
        assert info.value.status == 504
        assert await provider.list_managed() == []
    finally:
        await provider.close()


async def test_dropped_watch_still_becomes_ready(make_fake_kube, runtime_port):
    kube = await make_fake_kube()
    kube.controller.pause()
    provider = await started(kube, pool_options("sandbox", "v1beta1", runtime_port))
    try:
        pending = asyncio.create_task(provider.ensure(request("ses-drop")))
        await kube.server.wait_for_object("sandboxes", "default", "ses-drop")
        await kube.server.wait_for_watchers(1)  # the one shared watch, which this object's waiter reads
        kube.server.drop_watches()
        kube.controller.resume()
        endpoint = await pending
        assert endpoint.port == runtime_port
    finally:
        await provider.close()


async def test_watch_410_recovers(make_fake_kube, runtime_port):
    kube = await make_fake_kube()
    kube.controller.pause()
    provider = await started(kube, pool_options("sandbox", "v1beta1", runtime_port))
    try:
        pending = asyncio.create_task(provider.ensure(request("ses-gone")))
        await kube.server.wait_for_object("sandboxes", "default", "ses-gone")
        await kube.server.wait_for_watchers(1)
        kube.server.compact()
        kube.server.drop_watches()  # the resumed watch asks for a compacted version: 410
        kube.controller.resume()
        assert (await pending).port == runtime_port
    finally:
        await provider.close()


async def test_already_exists_under_another_installation_is_refused(make_fake_kube, runtime_port):
    """Adopting our own object again is the provider contract's (tests/test_providers.py); this is the refusal."""
    kube = await make_fake_kube()
    ours = await started(kube, pool_options("sandbox", "v1beta1", runtime_port), installation="test")
    theirs = await started(kube, pool_options("sandbox", "v1beta1", runtime_port), installation="other")
    try:
        await ours.ensure(request("ses-dup"))
        with pytest.raises(Conflict) as info:
            await theirs.ensure(request("ses-dup"))
        assert info.value.status == 409 and "ses-dup" in info.value.message
        assert kube.server.create_count("sandboxes", "default", "ses-dup") == 1
    finally:
        await ours.close()
        await theirs.close()


async def test_deleted_behind_our_back_is_healed_by_a_replica_whose_watch_never_told_it(make_fake_kube,
                                                                                     runtime_port):
    """The data plane found the sandbox unreachable; the provider's GET says the object is gone: the
    record is released once and the next resolve re-creates it. While the object exists, nothing is."""
    kube = await make_fake_kube()
    provider = await started(kube, pool_options("sandbox", "v1beta1", runtime_port))  # losses go to a list
    router = SessionRouter(MemoryStore(), PoolProviders({"small": provider, "shared": provider}), PER_SESSION,
                           replica_id="r")
    identity = Identity.parse(org_id="acme", user_id="alice", session_id="s1")
    try:
        route = await router.resolve(identity)
        await router.unreachable(route)  # a transient failure: the object is there and routable
        assert await router.store.get_sandbox(route.sandbox_id) is not None
        assert await provider.probe(route.sandbox_id, "small") is Probe.ALIVE
        api = client.CustomObjectsApi(await kube.api_client())
        await api.delete_namespaced_custom_object("agents.x-k8s.io", "v1beta1", "default", "sandboxes", route.sandbox_id)
        assert kube.server.get_object("sandboxes", "default", route.sandbox_id) is None
        assert await provider.probe(route.sandbox_id, "small") is Probe.GONE
        await asyncio.gather(*(router.unreachable(route) for _ in range(10)))
        assert await router.store.get_sandbox(route.sandbox_id) is None
        again = await router.resolve(identity)
        assert again.sandbox_id == route.sandbox_id
        assert kube.server.create_count("sandboxes", "default", route.sandbox_id) == 2  # re-created once
    finally:
        await provider.close()


async def test_orphan_sweep_deletes_only_this_installations_unknown_objects(make_fake_kube, runtime_port):
    kube = await make_fake_kube()
    ours = await started(kube, pool_options("sandbox", "v1beta1", runtime_port), installation="test")
    theirs = await started(kube, pool_options("sandbox", "v1beta1", runtime_port), installation="other")
    router = SessionRouter(MemoryStore(), PoolProviders({"small": ours, "shared": ours}), PER_SESSION, replica_id="r")
    try:
        known = await router.resolve(Identity.parse(org_id="acme", user_id="alice", session_id="known"))
        await ours.ensure(request("ses-orphan", pool="small"))
        await theirs.ensure(request("ses-foreign", pool="small"))
        swept = await router.lifecycle.sweep_orphans(grace=0.0)
        assert swept == ["ses-orphan"]
        names = {o["metadata"]["name"] for o in kube.server.list_objects("sandboxes", "default")}
        assert names == {known.sandbox_id, "ses-foreign"}
    finally:
        await ours.close()
        await theirs.close()


async def test_orphan_sweep_pages_through_the_objects_across_passes(make_fake_kube, runtime_port):
    """Each pass checks one API page (limit/continue) against the store; the passes add up to all."""
    kube = await make_fake_kube("head")
    provider = await started(kube, pool_options("sandbox", "v1beta1", runtime_port))
    router = SessionRouter(MemoryStore(), PoolProviders({"small": provider, "shared": provider}), PER_SESSION,
                           replica_id="r", tuning=RouterTuning(sweep_batch=2))
    try:
        known = await router.resolve(Identity.parse(org_id="acme", user_id="alice", session_id="known"))
        orphans = [f"ses-orphan-{i}" for i in range(4)]
        for name in orphans:
            await provider.ensure(request(name, pool="small"))
        swept = [await router.lifecycle.sweep_orphans(grace=0.0) for _ in range(3)]
        assert all(len(one) <= 2 for one in swept)  # bounded: never more than a page per pass
        assert sorted(sum(swept, [])) == orphans
        names = {o["metadata"]["name"] for o in kube.server.list_objects("sandboxes", "default")}
        assert names == {known.sandbox_id}
    finally:
        await provider.close()


async def test_grace_period_protects_young_orphans(make_fake_kube, runtime_port):
    kube = await make_fake_kube()
    provider = await started(kube, pool_options("sandbox", "v1beta1", runtime_port))
    router = SessionRouter(MemoryStore(), PoolProviders({"k8s": provider}),
                           parse_policy("pools: {k8s: {}}\nrouting: {prefix_pools: {default: k8s}}", "t"), replica_id="r")
    try:
        await provider.ensure(request("ses-young"))
        assert await router.lifecycle.sweep_orphans(grace=3600.0) == []
    finally:
        await provider.close()


async def test_two_hundred_concurrent_sessions_no_duplicate_creates(make_fake_kube, runtime_port):
    kube = await make_fake_kube(ready_delay=0.01)
    provider, router = await routed(kube, pool_options("sandbox", "v1beta1", runtime_port))
    identities = [Identity.parse(org_id="acme", user_id="u", session_id=f"s{i % 200}") for i in range(400)]
    try:
        started_at = time.perf_counter()
        routes = await asyncio.gather(*(router.resolve(i) for i in identities))
        elapsed = time.perf_counter() - started_at
        ids = {r.sandbox_id for r in routes}
        assert len(ids) == 200
        assert all(kube.server.create_count("sandboxes", "default", sid) == 1 for sid in ids)
        print(f"200 sandboxes provisioned concurrently in {elapsed:.2f}s")
    finally:
        await provider.close()


def k8s_policy(mode: str, api_version: str | None, port: int) -> str:
    options = pool_options(mode, api_version, port).model_dump(exclude_none=True)
    if api_version is None:
        del options["api_version"]
    pool = {"provider": "kubernetes", "kubernetes": options}
    import yaml

    return yaml.safe_dump({"pools": {"small": pool, "shared": pool}, "routing": {"per_session_orgs": ["iso"]}})


@pytest.mark.parametrize(("crd_set", "api_version", "mode"), [
    pytest.param("v1.0", None, "claim", id="v1.0-default-claim"),
    pytest.param("v0.4.6", "v1alpha1", "sandbox", id="v0.4.6-v1alpha1-sandbox"),
])
async def test_through_a_real_gateway(make_fake_kube, runtime_port, tmp_path, crd_set, api_version, mode):
    from tests.gateway_process import GatewayProcess

    kube = await make_fake_kube(crd_set)
    await seed_templates(kube, api_version or "v1beta1")
    policy = tmp_path / "policy.yaml"
    policy.write_text(k8s_policy(mode, api_version, runtime_port))
    gateway = await GatewayProcess(tmp_path / "gw", "--policy", str(policy), env={
        "SANDBOX_GATEWAY_KUBECONFIG": str(kube.kubeconfig_path), "SANDBOX_GATEWAY_INSTALLATION": "e2e"}).start()
    try:
        async with aiohttp.ClientSession() as http:
            hdrs = {"X-Org-Id": "iso", "X-User-Id": "alice", "X-Session-Id": "k1"}
            async with http.get(f"{gateway.data_url}/echo/x", headers=hdrs) as response:
                assert response.status == 200, await response.text()
                echoed = await response.json()
            sandbox_id = echoed["headers"]["X-Sandbox-Id"]
            assert sandbox_id.startswith("ses-")
            plural = "sandboxclaims" if mode == "claim" else "sandboxes"
            assert kube.server.create_count(plural, "default", sandbox_id) == 1
            created = [c for c in kube.server.create_calls if c.name == sandbox_id and c.actor == "client"]
            assert [(c.version, c.warnings) for c in created] == [(api_version or "v1beta1", ())]
            deleted = await http.delete(f"{gateway.control_url}/v1/sessions/k1")
            assert deleted.status == 200
        assert kube.server.get_object(plural, "default", sandbox_id) is None
    finally:
        await gateway.stop()


@pytest.mark.parametrize(("mode", "extra"), [
    pytest.param("sandbox", {"service": True, "shutdown_policy": "Delete", "lifetime": 3600.0,
                             "volume_claim_templates": [{"metadata": {"name": "work"}, "spec": {
                                 "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]},
                 id="sandbox with every optional field"),
    pytest.param("claim", {"shutdown_policy": "Delete", "lifetime": 3600.0}, id="claim with a lifecycle"),
])
async def test_a_pool_without_api_version_creates_what_agent_sandbox_v1_accepts(make_fake_kube, runtime_port,
                                                                               mode, extra):
    """No api_version means v1beta1, the only version agent-sandbox v1.0 serves; the objects pass the
    v1.0 CRD schema with no field pruned (an unknown field would come back as a warning)."""
    kube = await make_fake_kube()
    assert kube.crd_set == "v1.0"
    await seed_templates(kube, "v1beta1")
    options = pool_options(mode, None, runtime_port, **extra)
    assert options.api_version == "v1beta1"
    provider = await started(kube, options)
    try:
        endpoint = await provider.ensure(request("ses-v1"))
        assert endpoint.port == runtime_port
        plural = "sandboxclaims" if mode == "claim" else "sandboxes"
        [created] = [c for c in kube.server.create_calls if c.name == "ses-v1" and c.actor == "client"]
        assert (created.plural, created.name, created.version, created.warnings) == (plural, "ses-v1", "v1beta1", ())
        stored = kube.server.get_object(plural, "default", "ses-v1")
        if mode == "sandbox":
            assert stored["spec"]["operatingMode"] == "Running" and stored["spec"]["volumeClaimTemplates"]
        else:
            assert stored["spec"]["warmPoolRef"] == {"name": "warm"} and stored["spec"]["lifecycle"]["shutdownTime"]
    finally:
        await provider.close()


async def test_lost_pod_is_reported_and_the_sandbox_comes_back(make_fake_kube, runtime_port):
    kube = await make_fake_kube()
    provider, router = await routed(kube, pool_options("sandbox", "v1beta1", runtime_port))
    store = router.store
    identity = Identity.parse(org_id="acme", user_id="alice", session_id="s1")
    try:
        route = await router.resolve(identity)
        released = asyncio.Event()
        store.subscribe(lambda key: released.set() if key == route.sandbox_id else None)
        kube.controller.lose_pod(route.sandbox_id)
        await released.wait()
        kube.controller.recover(route.sandbox_id)
        again = await router.resolve(identity)  # adopts the existing object and waits for Ready again
        assert again.sandbox_id == route.sandbox_id
        assert kube.server.create_count("sandboxes", "default", route.sandbox_id, actor="client") == 1
    finally:
        await provider.close()


@pytest.mark.parametrize(("status", "expected"), [
    pytest.param(404, ObjectMissing, id="404 is a missing object (delete: done; read: None)"),
    pytest.param(409, ObjectExists, id="409 is an existing object (create: adopt)"),
    pytest.param(410, WatchExpired, id="410 is an expired watch version (read afresh)"),
    pytest.param(403, KubeApiError, id="anything else is a provider failure"),
    pytest.param(500, KubeApiError, id="a server error too"),
])
def test_api_errors_are_translated_by_status_and_chained(status, expected):
    """One mapper for every API call: our error tree by status (never by message), 503
    provision_failed for a client, the ApiException kept as the cause."""
    original = ApiException(status=status, reason="Because")
    with pytest.raises(expected) as excinfo, translated("creating Sandbox sbx-1", "sbx-1"):
        raise original
    error = excinfo.value
    assert type(error) is expected and isinstance(error, ProvisionFailed)
    assert error.__cause__ is original
    assert error.status == 503 and error.sandbox_id == "sbx-1"
    assert error.message == f"Kubernetes API error {status} Because while creating Sandbox sbx-1"


@pytest.mark.parametrize(("crd_set", "api_version"), [
    pytest.param("v1.0", None, id="v1.0-default"),
    pytest.param("v0.4.6", "v1alpha1", id="v0.4.6-v1alpha1"),
])
async def test_router_compat_locator_per_version(make_fake_kube, crd_set, api_version):
    """The router headers' locator reads Sandboxes at v1beta1 unless told v1alpha1 (v0.4/v0.5)."""
    kube = await make_fake_kube(crd_set)
    version = api_version or Settings().router_compat_api_version
    assert version == ("v1beta1" if crd_set == "v1.0" else "v1alpha1")
    locator = KubernetesSandboxLocator(version, api_client_=await kube.api_client())
    await locator.start()
    api = client.CustomObjectsApi(await kube.api_client())
    kube.controller.pause()
    await api.create_namespaced_custom_object("agents.x-k8s.io", version, "default", "sandboxes", {
        "apiVersion": f"agents.x-k8s.io/{version}", "kind": "Sandbox", "metadata": {"name": "located"},
        "spec": {"podTemplate": POD_TEMPLATE}})
    with pytest.raises(ProvisionFailed) as pending:
        await locator.locate("default", "located")
    assert pending.value.code == "sandbox_not_ready"
    kube.controller.resume()
    await kube.server.wait_for_object("sandboxes", "default", "located",
                                      lambda o: bool((o.get("status") or {}).get("podIPs")))
    assert await locator.locate("default", "located") == "127.0.0.1"
    with pytest.raises(NotFound):
        await locator.locate("default", "nowhere")
    await locator.close()
