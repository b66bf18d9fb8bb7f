"""The fake kube-apiserver's simulated agent-sandbox controller (tests/fakekube/controller.py): readiness
per version, suspend and resume, failure hooks, claims and warm pools, delete propagation; driven only
through the real kubernetes_asyncio client, as in test_fakekube.py."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.fakekube.fixtures import FakeKube, fake_kube, make_fake_kube  # noqa: F401
from tests.fakekube.helpers import EXT, SBX, Obj, Waiter, ext, ready, sandbox, template
from tests.test_fakekube import MERGE, NS, api, expect_error, wait_for  # noqa: F401  (fixtures)


# --- the simulated controller ----------------------------------------------------------------------

@pytest.mark.parametrize("fake_kube", ["v1.0", "v0.4.6"], indirect=True)
async def test_sandbox_becomes_ready_per_version(fake_kube: FakeKube, api: client.CustomObjectsApi,
                                                 wait_for: Waiter) -> None:
    version = "v1beta1" if fake_kube.crd_set == "v1.0" else "v1alpha1"
    await api.create_namespaced_custom_object(SBX, version, NS, "sandboxes", sandbox("rdy", version))
    obj = await wait_for(api, SBX, version, "sandboxes", "rdy", lambda o: ready(o).get("status") == "True")
    assert ready(obj)["reason"] == "DependenciesReady" and obj["status"]["podIPs"] == ["127.0.0.1"]
    if fake_kube.crd_set == "v0.4.6":  # old controller: always a Service, status.replicas
        assert obj["status"]["serviceFQDN"] == "rdy.default.svc.cluster.local" and obj["status"]["replicas"] == 1
    else:
        assert "serviceFQDN" not in obj["status"]
    core = client.CoreV1Api(api.api_client)
    pod = await core.read_namespaced_pod("rdy", NS)
    assert pod.status.pod_ip == "127.0.0.1" and pod.status.phase == "Running"


@pytest.mark.parametrize("fake_kube", ["v1.0", "v0.4.6"], indirect=True)
async def test_suspended_sandbox(fake_kube: FakeKube, api: client.CustomObjectsApi, wait_for: Waiter) -> None:
    version, spec = ("v1beta1", {"operatingMode": "Suspended"}) if fake_kube.crd_set == "v1.0" else (
        "v1alpha1", {"replicas": 0})
    await api.create_namespaced_custom_object(SBX, version, NS, "sandboxes", sandbox("zzz", version, **spec))
    obj = await wait_for(api, SBX, version, "sandboxes", "zzz", lambda o: bool(ready(o)))
    if fake_kube.crd_set == "v0.4.6":  # old controllers report Ready with no pod (but still a serviceFQDN!)
        assert ready(obj)["status"] == "True" and "podIPs" not in obj["status"] and obj["status"]["serviceFQDN"]
        assert obj["status"]["replicas"] == 0
    else:
        assert ready(obj)["status"] == "False" and ready(obj)["reason"] == "SandboxSuspended"


# How each served version says suspend and resume: (suspend, resume) spec fields.
SUSPEND_RESUME = {"v1beta1": ({"operatingMode": "Suspended"}, {"operatingMode": "Running"}),
                  "v1alpha1": ({"replicas": 0}, {"replicas": 1})}


@pytest.mark.parametrize("fake_kube", [
    pytest.param("v1.0", id="v1.0 operatingMode Suspended/Running"),
    pytest.param("v0.4.6", id="v0.4.6 replicas 0/1"),
], indirect=True)
async def test_suspend_drops_the_pod_and_resume_brings_a_new_pod_ip(fake_kube: FakeKube, api: client.CustomObjectsApi,
                                                                   wait_for: Waiter) -> None:
    version = "v1beta1" if fake_kube.crd_set == "v1.0" else "v1alpha1"
    suspend, resume = SUSPEND_RESUME[version]
    core = client.CoreV1Api(api.api_client)
    await api.create_namespaced_custom_object(SBX, version, NS, "sandboxes", sandbox("nap", version))
    running = await wait_for(api, SBX, version, "sandboxes", "nap", lambda o: ready(o).get("status") == "True")
    assert running["status"]["podIPs"] == ["127.0.0.1"]

    await api.patch_namespaced_custom_object(SBX, version, NS, "sandboxes", "nap", {"spec": suspend},
                                             _content_type=MERGE)
    asleep = await wait_for(api, SBX, version, "sandboxes", "nap", lambda o: "podIPs" not in o["status"])
    if version == "v1beta1":
        assert ready(asleep)["status"] == "False" and ready(asleep)["reason"] == "SandboxSuspended"
    else:  # the old controller still says Ready, with no pod: why the provider also requires a pod IP
        assert ready(asleep)["status"] == "True" and asleep["status"]["replicas"] == 0
    await expect_error(404, core.read_namespaced_pod("nap", NS))

    fake_kube.controller.pause()  # hold the new pod at Pending to see the state in between
    await api.patch_namespaced_custom_object(SBX, version, NS, "sandboxes", "nap", {"spec": resume},
                                             _content_type=MERGE)
    waking = await wait_for(api, SBX, version, "sandboxes", "nap",
                            lambda o: ready(o).get("reason") == "DependenciesNotReady")
    assert ready(waking)["status"] == "False" and "podIPs" not in waking["status"]
    assert (await core.read_namespaced_pod("nap", NS)).status.phase == "Pending"
    fake_kube.controller.resume()
    awake = await wait_for(api, SBX, version, "sandboxes", "nap",
                           lambda o: ready(o).get("status") == "True" and bool(o["status"].get("podIPs")))
    assert awake["status"]["podIPs"] == ["127.0.0.2"], "a resumed Sandbox runs in a new pod, with a new IP"
    pod = await core.read_namespaced_pod("nap", NS)
    assert pod.status.pod_ip == "127.0.0.2" and pod.status.phase == "Running"
    if version == "v1alpha1":
        assert awake["status"]["replicas"] == 1


async def test_fail_lose_pod_and_recover_hooks(fake_kube: FakeKube, api: client.CustomObjectsApi,
                                               wait_for: Waiter) -> None:
    for name in ("f1", "f2"):
        await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox(name))
        await wait_for(api, SBX, "v1beta1", "sandboxes", name, lambda o: ready(o).get("status") == "True")
    fake_kube.controller.fail("f1", reason="PodFailed", message="OOMKilled")
    failed = await wait_for(api, SBX, "v1beta1", "sandboxes", "f1", lambda o: ready(o).get("status") == "False")
    assert ready(failed)["reason"] == "PodFailed" and ready(failed)["message"] == "OOMKilled"
    assert "podIPs" not in failed["status"]
    fake_kube.controller.lose_pod("f2")
    lost = await wait_for(api, SBX, "v1beta1", "sandboxes", "f2", lambda o: ready(o).get("status") == "False")
    assert ready(lost)["reason"] == "DependenciesNotReady" and "podIPs" not in lost["status"]
    fake_kube.controller.recover("f2")
    await wait_for(api, SBX, "v1beta1", "sandboxes", "f2", lambda o: ready(o).get("status") == "True")


async def test_pause_holds_readiness(fake_kube: FakeKube, api: client.CustomObjectsApi, wait_for: Waiter) -> None:
    fake_kube.controller.pause()
    await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("held"))
    pending = await wait_for(api, SBX, "v1beta1", "sandboxes", "held", lambda o: bool(ready(o)))
    assert ready(pending)["reason"] == "DependenciesNotReady"
    fake_kube.controller.resume()
    await wait_for(api, SBX, "v1beta1", "sandboxes", "held", lambda o: ready(o).get("status") == "True")


async def test_shutdown_time_expires_and_deletes(api: client.CustomObjectsApi, wait_for: Waiter) -> None:
    past = (datetime.now(timezone.utc) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("old", shutdownTime=past))
    expired = await wait_for(api, SBX, "v1beta1", "sandboxes", "old", lambda o: bool(ready(o)))
    assert ready(expired)["reason"] == "SandboxExpired" and "podIPs" not in expired["status"]
    created = await api.create_namespaced_custom_object(
        SBX, "v1beta1", NS, "sandboxes", sandbox("gone", shutdownTime=past, shutdownPolicy="Delete"))
    await wait_for.deleted(api, "gone", created["metadata"]["resourceVersion"])


async def create_template(api: client.CustomObjectsApi, version: str = "v1beta1", **spec: Any) -> None:
    await api.create_namespaced_custom_object(EXT, version, NS, "sandboxtemplates", template("tpl", version, **spec))


async def test_claim_cold_start_and_cascade_delete(fake_kube: FakeKube, api: client.CustomObjectsApi,
                                                   wait_for: Waiter) -> None:
    await api.create_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims", ext(
        "SandboxClaim", "cold", "v1beta1", {"warmPoolRef": {"name": "shadow-pool-tpl"}}))
    missing = await wait_for(api, EXT, "v1beta1", "sandboxclaims", "cold", lambda o: bool(ready(o)))
    assert ready(missing)["reason"] == "TemplateNotFound"
    await create_template(api)
    claim = await wait_for(api, EXT, "v1beta1", "sandboxclaims", "cold", lambda o: ready(o).get("status") == "True")
    assert claim["status"]["sandbox"] == {"name": "cold", "podIPs": ["127.0.0.1"]}
    sb = await api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "cold")
    assert sb["metadata"]["ownerReferences"][0]["kind"] == "SandboxClaim"
    assert fake_kube.server.create_count("sandboxes", NS, "cold") == 1
    await api.delete_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims", "cold")
    await wait_for.deleted(api, "cold", "1")


async def test_claim_from_warm_pool(fake_kube: FakeKube, api: client.CustomObjectsApi, wait_for: Waiter) -> None:
    await api.create_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims", ext(
        "SandboxClaim", "early", "v1beta1", {"warmPoolRef": {"name": "pool"}}))
    early = await wait_for(api, EXT, "v1beta1", "sandboxclaims", "early", lambda o: bool(ready(o)))
    assert ready(early)["reason"] == "WarmPoolNotFound"
    await create_template(api)
    await api.create_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxwarmpools", ext(
        "SandboxWarmPool", "pool", "v1beta1", {"sandboxTemplateRef": {"name": "tpl"}, "replicas": 2}))
    pool = await wait_for(api, EXT, "v1beta1", "sandboxwarmpools", "pool",
                          lambda o: o.get("status", {}).get("readyReplicas") == 2)
    assert pool["status"]["selector"].startswith("agents.x-k8s.io/warm-pool-sandbox=")
    claim = await wait_for(api, EXT, "v1beta1", "sandboxclaims", "early", lambda o: ready(o).get("status") == "True")
    adopted = claim["status"]["sandbox"]["name"]
    assert adopted.startswith("pool-") and adopted != "early"
    await api.create_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims", ext(
        "SandboxClaim", "late", "v1beta1", {"warmPoolRef": {"name": "pool"}}))
    late = await wait_for(api, EXT, "v1beta1", "sandboxclaims", "late", lambda o: ready(o).get("status") == "True")
    assert late["status"]["sandbox"]["name"] not in (adopted, "late")
    sb = await api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", adopted)
    assert sb["metadata"]["ownerReferences"][0]["name"] == "early"
    await wait_for(api, EXT, "v1beta1", "sandboxwarmpools", "pool",
                   lambda o: o.get("status", {}).get("readyReplicas") == 2)  # replenished
    by_client = [c for c in fake_kube.server.create_calls if c.plural == "sandboxes" and c.actor == "client"]
    assert by_client == [] and fake_kube.server.create_count("sandboxes", NS, "early") == 0


async def test_v1alpha1_claim_with_warm_pool_policy(make_fake_kube: Any, wait_for: Waiter) -> None:
    kube = await make_fake_kube("v0.4.6", ready_delay=0)
    api = client.CustomObjectsApi(await kube.api_client())
    await create_template(api, "v1alpha1")
    await api.create_namespaced_custom_object(EXT, "v1alpha1", NS, "sandboxwarmpools", ext(
        "SandboxWarmPool", "wp", "v1alpha1", {"sandboxTemplateRef": {"name": "tpl"}, "replicas": 1}))
    await wait_for(api, EXT, "v1alpha1", "sandboxwarmpools", "wp",
                   lambda o: o.get("status", {}).get("readyReplicas") == 1)
    await api.create_namespaced_custom_object(EXT, "v1alpha1", NS, "sandboxclaims", ext(
        "SandboxClaim", "warm", "v1alpha1", {"sandboxTemplateRef": {"name": "tpl"}}))
    await api.create_namespaced_custom_object(EXT, "v1alpha1", NS, "sandboxclaims", ext(
        "SandboxClaim", "fresh", "v1alpha1", {"sandboxTemplateRef": {"name": "tpl"}, "warmpool": "none"}))
    warm = await wait_for(api, EXT, "v1alpha1", "sandboxclaims", "warm", lambda o: ready(o).get("status") == "True")
    fresh = await wait_for(api, EXT, "v1alpha1", "sandboxclaims", "fresh", lambda o: ready(o).get("status") == "True")
    assert warm["status"]["sandbox"]["name"].startswith("wp-") and fresh["status"]["sandbox"]["name"] == "fresh"


PAST = "2020-01-01T00:00:00Z"
ENV = [{"name": "TOKEN", "value": "t"}]


@pytest.mark.parametrize(("spec", "template", "reason"), [
    pytest.param({"warmPoolRef": {"name": "shadow-pool-tpl"}}, None, "TemplateNotFound", id="template missing"),
    pytest.param({"warmPoolRef": {"name": "missing"}}, {}, "WarmPoolNotFound", id="warm pool missing"),
    pytest.param({"warmPoolRef": {"name": "shadow-pool-tpl"}, "env": ENV}, {}, "EnvVarsInjectionRejected",
                 id="env injection disallowed by the template"),
    pytest.param({"warmPoolRef": {"name": "shadow-pool-tpl"}, "lifecycle": {"shutdownTime": PAST}}, {},
                 "ClaimExpired", id="claim expired"),
    pytest.param({"warmPoolRef": {"name": "shadow-pool-tpl"}, "env": ENV}, {"envVarsInjectionPolicy": "Allowed"},
                 "DependenciesReady", id="env injection allowed"),
])
async def test_claim_ready_reasons(api: client.CustomObjectsApi, wait_for: Waiter, spec: Obj, template: Obj | None,
                                   reason: str) -> None:
    if template is not None:
        await create_template(api, **template)
    await api.create_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims",
                                              ext("SandboxClaim", "c", "v1beta1", spec))
    claim = await wait_for(api, EXT, "v1beta1", "sandboxclaims", "c",
                           lambda o: ready(o).get("reason") not in (None, "SandboxNotReady", "DependenciesNotReady"))
    assert ready(claim)["reason"] == reason
    if reason == "DependenciesReady":
        sb = await api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "c")
        assert sb["spec"]["podTemplate"]["spec"]["containers"][0]["env"] == ENV
    else:
        assert ready(claim)["status"] == "False" and "sandbox" not in claim["status"]


async def test_delete_propagation_policies(api: client.CustomObjectsApi, wait_for: Waiter) -> None:
    await create_template(api)
    for name in ("fg", "orph"):
        await api.create_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims", ext(
            "SandboxClaim", name, "v1beta1", {"warmPoolRef": {"name": "shadow-pool-tpl"}}))
        await wait_for(api, EXT, "v1beta1", "sandboxclaims", name, lambda o: ready(o).get("status") == "True")
    listed = await api.list_cluster_custom_object(SBX, "v1beta1", "sandboxes")
    since = listed["metadata"]["resourceVersion"]
    await api.delete_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims", "fg",
                                              propagation_policy="Foreground")  # 202: the client returns None
    order = []
    for group, plural in ((EXT, "sandboxclaims"), (SBX, "sandboxes")):
        w = watch.Watch()
        async with asyncio.timeout(5):
            async for event in w.stream(api.list_namespaced_custom_object, group, "v1beta1", NS, plural,
                                        field_selector="metadata.name=fg", resource_version=since):
                meta = event["object"]["metadata"]
                order.append((int(meta["resourceVersion"]), plural, event["type"],
                              bool(meta.get("deletionTimestamp")), meta.get("finalizers")))
                if event["type"] == "DELETED":
                    break
        await w.close()
    assert [o[1:4] for o in sorted(order)] == [  # the owner waits for its dependents (which have pods)
        ("sandboxclaims", "MODIFIED", True), ("sandboxes", "MODIFIED", True),
        ("sandboxes", "DELETED", True), ("sandboxclaims", "DELETED", True)]
    assert sorted(order)[0][4] == ["foregroundDeletion"]
    await api.delete_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims", "orph",
                                              body=client.V1DeleteOptions(propagation_policy="Orphan"))
    orphan = await wait_for(api, SBX, "v1beta1", "sandboxes", "orph",
                            lambda o: not o["metadata"].get("ownerReferences"))
    assert orphan["metadata"]["name"] == "orph"


async def test_auth_and_discovery(fake_kube: FakeKube) -> None:
    async with client.ApiClient(client.Configuration(host=fake_kube.url)) as anonymous:
        with pytest.raises(ApiException) as info:
            await client.CustomObjectsApi(anonymous).list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes")
        assert info.value.status == 401
    api_client = await fake_kube.api_client()
    resources = await client.CustomObjectsApi(api_client).get_api_resources(EXT, "v1beta1")
    assert {r.name for r in resources.resources} >= {"sandboxclaims", "sandboxclaims/status", "sandboxwarmpools"}
    version = await client.VersionApi(api_client).get_code()
    assert version.major == "1"
    await api_client.close()
