"""The fake kube-apiserver (tests/fakekube), driven only through the real kubernetes_asyncio client."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.fakekube.fixtures import FakeKube, fake_kube, make_fake_kube  # noqa: F401
from tests.fakekube.helpers import EXT, SBX, Obj, Waiter, ext, ready, sandbox, template
from tests.fakekube.schema import normalize, validate

NS = "default"
MERGE = "application/merge-patch+json"


@pytest.fixture
async def api(fake_kube: FakeKube) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(await fake_kube.api_client())


@pytest.fixture
async def wait_for() -> AsyncIterator[Waiter]:
    waiter = Waiter(NS)
    yield waiter
    await waiter.close()


async def expect_error(status: int, call: Any) -> Obj:
    with pytest.raises(ApiException) as info:
        await call
    assert info.value.status == status, info.value.body
    return json.loads(info.value.body)


# --- CRUD and apiserver semantics -----------------------------------------------------------------

async def test_crud_round_trip(api: client.CustomObjectsApi) -> None:
    created = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("sb-1"))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1 and meta["namespace"] == NS
    assert int(meta["resourceVersion"]) > 0
    assert created["spec"]["operatingMode"] == "Running" and created["spec"]["shutdownPolicy"] == "Retain"  # defaults

    got = await api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "sb-1")
    assert got["metadata"]["uid"] == meta["uid"]
    listed = await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes")
    assert listed["kind"] == "SandboxList" and [i["metadata"]["name"] for i in listed["items"]] == ["sb-1"]
    assert int(listed["metadata"]["resourceVersion"]) >= int(meta["resourceVersion"])

    latest = await api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "sb-1")
    latest["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "example/runtime:2"
    replaced = await api.replace_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "sb-1", latest)
    assert replaced["metadata"]["generation"] == 2
    assert int(replaced["metadata"]["resourceVersion"]) > int(latest["metadata"]["resourceVersion"])

    patched = await api.patch_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "sb-1",
                                                       {"metadata": {"labels": {"team": "a"}}}, _content_type=MERGE)
    assert patched["metadata"]["labels"] == {"team": "a"} and patched["metadata"]["generation"] == 2
    jsonpatched = await api.patch_namespaced_custom_object(
        SBX, "v1beta1", NS, "sandboxes", "sb-1",
        [{"op": "replace", "path": "/spec/operatingMode", "value": "Suspended"}])
    assert jsonpatched["spec"]["operatingMode"] == "Suspended" and jsonpatched["metadata"]["generation"] == 3

    deleted = await api.delete_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "sb-1")
    assert deleted["status"] == "Success" and deleted["details"]["uid"] == meta["uid"]
    await expect_error(404, api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "sb-1"))


async def test_errors_are_status_objects(api: client.CustomObjectsApi) -> None:
    await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("dup"))
    body = await expect_error(409, api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes",
                                                                      sandbox("dup")))
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": 'sandboxes.agents.x-k8s.io "dup" already exists', "reason": "AlreadyExists",
                    "code": 409, "details": {"name": "dup", "group": SBX, "kind": "sandboxes"}}
    body = await expect_error(404, api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "nope"))
    assert body["reason"] == "NotFound" and body["details"]["name"] == "nope"
    await expect_error(404, api.create_namespaced_custom_object(SBX, "v1beta1", "no-such-ns", "sandboxes",
                                                               sandbox("x")))
    # a dict body makes kubernetes_asyncio send json-patch: the apiserver refuses it, as here
    body = await expect_error(400, api.patch_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "dup",
                                                                      {"metadata": {"labels": {"a": "b"}}}))
    assert body["reason"] == "BadRequest"


async def test_optimistic_concurrency(api: client.CustomObjectsApi) -> None:
    first = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("occ"))
    await api.patch_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "occ",
                                             {"metadata": {"labels": {"v": "2"}}}, _content_type=MERGE)
    body = await expect_error(409, api.replace_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "occ", first))
    assert body["reason"] == "Conflict" and "the object has been modified" in body["message"]
    del first["metadata"]["resourceVersion"]
    body = await expect_error(422, api.replace_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "occ", first))
    assert body["details"]["causes"][0]["field"] == "metadata.resourceVersion"
    body = await expect_error(409, api.delete_namespaced_custom_object(
        SBX, "v1beta1", NS, "sandboxes", "occ", body=client.V1DeleteOptions(preconditions={"uid": "other"})))
    assert "Precondition failed" in body["message"]


async def test_status_subresource_semantics(make_fake_kube: Any, wait_for: Waiter) -> None:
    kube = await make_fake_kube(ready_delay=0)
    api = client.CustomObjectsApi(await kube.api_client())
    body = sandbox("st", status={"podIPs": ["10.9.9.9"]})
    await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", body)
    current = await wait_for(api, SBX, "v1beta1", "sandboxes", "st", lambda o: bool(ready(o)))
    await kube.controller.stop()  # from here on nobody else writes the status
    current = await api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "st")
    assert current["status"].get("podIPs") != ["10.9.9.9"]  # status is ignored on create
    before = copy.deepcopy(current["status"])
    current["status"]["podIPs"] = ["10.9.9.9"]
    current["metadata"]["labels"] = {"changed": "yes"}
    after = await api.replace_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "st", current)
    assert after["status"] == before and after["metadata"]["labels"] == {"changed": "yes"}
    assert after["metadata"]["generation"] == 1  # metadata-only change
    after["status"]["podIPs"] = ["10.1.1.1"]
    after["spec"]["operatingMode"] = "Suspended"
    after["metadata"]["labels"] = {"changed": "again"}
    status = await api.replace_namespaced_custom_object_status(SBX, "v1beta1", NS, "sandboxes", "st", after)
    assert status["status"]["podIPs"] == ["10.1.1.1"]
    assert status["spec"]["operatingMode"] == "Running" and status["metadata"]["labels"] == {"changed": "yes"}
    patched = await api.patch_namespaced_custom_object_status(SBX, "v1beta1", NS, "sandboxes", "st",
                                                              {"status": {"nodeName": "n1"}}, _content_type=MERGE)
    assert patched["status"]["nodeName"] == "n1" and patched["metadata"]["generation"] == 1
    got = await api.get_namespaced_custom_object_status(SBX, "v1beta1", NS, "sandboxes", "st")
    assert got["status"]["podIPs"] == ["10.1.1.1"]


async def test_schema_validation(api: client.CustomObjectsApi) -> None:
    bad = sandbox("bad", operatingMode="Sideways")
    bad["spec"]["podTemplate"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    del bad["spec"]["podTemplate"]["spec"]["containers"][0]["name"]
    body = await expect_error(422, api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", bad))
    assert body["reason"] == "Invalid" and body["details"]["kind"] == "Sandbox"
    causes = {c["field"]: c["reason"] for c in body["details"]["causes"]}
    assert causes == {"spec.podTemplate.spec.containers[0].ports[0].containerPort": "FieldValueTypeInvalid",
                      "spec.podTemplate.spec.containers[0].name": "FieldValueRequired",
                      "spec.operatingMode": "FieldValueNotSupported"}
    dup = sandbox("dup-containers")
    dup["spec"]["podTemplate"]["spec"]["containers"].append(dict(dup["spec"]["podTemplate"]["spec"]["containers"][0]))
    body = await expect_error(422, api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", dup))
    assert body["details"]["causes"][0]["reason"] == "FieldValueDuplicate"
    long_name = "s" * 64
    body = await expect_error(422, api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes",
                                                                      sandbox(long_name)))
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    await expect_error(422, api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("a.b")))
    # CEL transition rule of v1beta1 Sandbox: volumeClaimTemplates is immutable
    await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("vct"))
    body = await expect_error(422, api.patch_namespaced_custom_object(
        SBX, "v1beta1", NS, "sandboxes", "vct", {"spec": {"volumeClaimTemplates": [{"spec": {}}]}},
        _content_type=MERGE))
    assert "volumeClaimTemplates is immutable" in body["message"]


async def test_unknown_fields_pruned_or_rejected_when_strict(api: client.CustomObjectsApi) -> None:
    body = sandbox("prune", surprise=True)
    body["metadata"]["bogus"] = 1
    body["spec"]["podTemplate"]["spec"]["containers"][0]["colour"] = "red"
    created = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", body)
    assert "surprise" not in created["spec"] and "bogus" not in created["metadata"]
    assert "colour" not in created["spec"]["podTemplate"]["spec"]["containers"][0]
    body["metadata"]["name"] = "strict"
    error = await expect_error(400, api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", body,
                                                                       field_validation="Strict"))
    assert 'unknown field "spec.surprise"' in error["message"] and 'unknown field "metadata.bogus"' in error["message"]
    assert 'unknown field "spec.podTemplate.spec.containers[0].colour"' in error["message"]


async def test_generate_name(fake_kube: FakeKube, api: client.CustomObjectsApi) -> None:
    body = sandbox("")
    body["metadata"] = {"generateName": "pool-"}
    first = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", body)
    second = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", body)
    names = {first["metadata"]["name"], second["metadata"]["name"]}
    assert len(names) == 2 and all(n.startswith("pool-") and len(n) == 10 for n in names)
    assert [fake_kube.server.create_count("sandboxes", NS, n, actor="client") for n in names] == [1, 1]


async def test_label_and_field_selectors(api: client.CustomObjectsApi) -> None:
    for name, labels in [("s1", {"pool": "small", "tier": "a"}), ("s2", {"pool": "shared"}), ("s3", {})]:
        await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox(name, labels=labels))

    async def names(**selectors: str) -> list[str]:
        listed = await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", **selectors)
        return [i["metadata"]["name"] for i in listed["items"]]

    assert await names(label_selector="pool=small") == ["s1"]
    assert await names(label_selector="pool!=small") == ["s2", "s3"]
    assert await names(label_selector="pool") == ["s1", "s2"]
    assert await names(label_selector="!pool") == ["s3"]
    assert await names(label_selector="pool in (small, shared),!tier") == ["s2"]
    assert await names(label_selector="pool notin (small)") == ["s2", "s3"]
    assert await names(field_selector="metadata.name=s2") == ["s2"]
    assert await names(field_selector="metadata.namespace!=default") == []
    await expect_error(400, api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes",
                                                              field_selector="spec.replicas=1"))
    await expect_error(400, api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes",
                                                              label_selector="a in (b"))
    page = await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", limit=2)
    assert len(page["items"]) == 2 and page["metadata"]["continue"]
    rest = await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes",
                                                   _continue=page["metadata"]["continue"])
    assert [i["metadata"]["name"] for i in rest["items"]] == ["s3"]
    everywhere = await api.list_cluster_custom_object(SBX, "v1beta1", "sandboxes", label_selector="pool")
    assert len(everywhere["items"]) == 2


# --- watch ------------------------------------------------------------------------------------------

async def test_watch_from_create_sees_ready(fake_kube: FakeKube, api: client.CustomObjectsApi) -> None:
    fake_kube.controller.pod_ip_for = lambda ns, name: "10.0.0.7"
    created = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("w1"))
    seen = []
    w = watch.Watch()
    async with asyncio.timeout(5):
        async for event in w.stream(api.list_namespaced_custom_object, SBX, "v1beta1", NS, "sandboxes",
                                    resource_version=created["metadata"]["resourceVersion"]):
            seen.append((event["type"], ready(event["object"]).get("reason")))
            if ready(event["object"]).get("status") == "True":
                final = event["object"]
                break
    await w.close()
    assert seen == [("MODIFIED", "DependenciesNotReady"), ("MODIFIED", "DependenciesReady")]
    assert final["status"]["podIPs"] == ["10.0.0.7"] and final["status"]["nodeName"] == "fake-node"
    assert final["status"]["selector"].startswith("agents.x-k8s.io/sandbox-name-hash=")


async def test_watch_label_selector_transitions(api: client.CustomObjectsApi) -> None:
    created = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("lbl"))
    rv = created["metadata"]["resourceVersion"]
    for value in ("yes", "no"):
        await api.patch_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "lbl",
                                                 {"metadata": {"labels": {"watched": value}}}, _content_type=MERGE)
    events = []
    w = watch.Watch()
    async for event in w.stream(api.list_namespaced_custom_object, SBX, "v1beta1", NS, "sandboxes",
                                resource_version=rv, label_selector="watched=yes", timeout_seconds=1):
        events.append((event["type"], event["object"]["metadata"]["labels"]["watched"]))
        if len(events) == 2:
            break
    await w.close()
    assert events == [("ADDED", "yes"), ("DELETED", "no")]


async def test_watch_expired_after_compaction(fake_kube: FakeKube, api: client.CustomObjectsApi) -> None:
    first = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("c1"))
    await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("c2"))
    fake_kube.server.compact()
    for kwargs in ({"timeout_seconds": 5}, {}):  # with and without the client's one-retry reconnect
        w = watch.Watch()
        with pytest.raises(ApiException) as info:
            async for _ in w.stream(api.list_namespaced_custom_object, SBX, "v1beta1", NS, "sandboxes",
                                    resource_version=first["metadata"]["resourceVersion"], **kwargs):
                pass
        await w.close()
        assert info.value.status == 410 and "too old resource version" in info.value.reason


async def test_history_is_bounded(make_fake_kube: Any) -> None:
    kube = await make_fake_kube(history_size=3, ready_delay=0)
    kube.controller.pause()
    api = client.CustomObjectsApi(await kube.api_client())
    first = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("h0"))
    for i in range(1, 4):
        await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox(f"h{i}"))
    w = watch.Watch()
    with pytest.raises(ApiException) as info:
        async for _ in w.stream(api.list_namespaced_custom_object, SBX, "v1beta1", NS, "sandboxes",
                                resource_version=first["metadata"]["resourceVersion"], timeout_seconds=5):
            pass
    await w.close()
    assert info.value.status == 410


async def test_dropped_watch_then_resume_from_last_rv(fake_kube: FakeKube, api: client.CustomObjectsApi) -> None:
    fake_kube.controller.pause()
    created = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("d1"))
    w = watch.Watch()
    last_rv = created["metadata"]["resourceVersion"]
    with pytest.raises(aiohttp.ClientPayloadError):
        async for event in w.stream(api.list_namespaced_custom_object, SBX, "v1beta1", NS, "sandboxes",
                                    resource_version=last_rv):
            last_rv = event["object"]["metadata"]["resourceVersion"]
            assert fake_kube.server.drop_watches() == 1
            await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("d2"))
    await w.close()
    fake_kube.controller.resume()
    w = watch.Watch()
    async with asyncio.timeout(5):
        async for event in w.stream(api.list_namespaced_custom_object, SBX, "v1beta1", NS, "sandboxes",
                                    resource_version=last_rv):
            if event["type"] == "ADDED":
                assert event["object"]["metadata"]["name"] == "d2"  # nothing missed while disconnected
                break
    await w.close()


async def test_watch_ends_when_the_client_goes_away(fake_kube: FakeKube, api: client.CustomObjectsApi) -> None:
    """A watch the client closes is unregistered at once, even if no event will ever match it again
    (the gateway's per-object watches): else each one stays woken by every later write, until its timeout."""
    response = await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", watch=True,
                                                       field_selector="metadata.name=quiet", timeout_seconds=300,
                                                       _preload_content=False)
    await fake_kube.server.wait_for_watchers(1)
    changed = asyncio.Event()
    unsubscribe = fake_kube.server.store.on_watchers_changed(changed.set)
    response.release()  # as the gateway does once its object is ready: mid-stream, so the connection closes
    try:
        async with asyncio.timeout(5):
            while fake_kube.server.open_watches:
                changed.clear()
                await changed.wait()
    finally:
        unsubscribe()


async def test_watch_timeout_and_bookmarks(fake_kube: FakeKube, api: client.CustomObjectsApi) -> None:
    w = watch.Watch()
    events = [e async for e in w.stream(api.list_namespaced_custom_object, SBX, "v1beta1", NS, "sandboxes",
                                        timeout_seconds=0.2, allow_watch_bookmarks=True)]
    await w.close()
    assert [e["type"] for e in events] == ["BOOKMARK"]  # the stream ended at timeoutSeconds
    await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("bm"))
    fake_kube.controller.pause()
    types = []
    w = watch.Watch()
    async for event in w.stream(api.list_namespaced_custom_object, SBX, "v1beta1", NS, "sandboxes",
                                allow_watch_bookmarks=True, timeout_seconds=5):
        types.append(event["type"])
        if event["type"] == "BOOKMARK":
            assert event["object"]["metadata"]["resourceVersion"] == str(fake_kube.server.resource_version)
            break
        fake_kube.server.send_bookmarks()  # after the synthetic ADDED of the current state
    await w.close()
    assert types[0] == "ADDED" and types[-1] == "BOOKMARK"


# --- versions and conversion ------------------------------------------------------------------------

async def test_head_serves_both_versions_and_converts(make_fake_kube: Any) -> None:
    """The `head` set (the v0.5 line): v1beta1 stored, v1alpha1 still served through conversion."""
    api = client.CustomObjectsApi(await (await make_fake_kube("head")).api_client())
    await api.create_namespaced_custom_object(SBX, "v1alpha1", NS, "sandboxes",
                                              sandbox("alpha", "v1alpha1", replicas=0))
    beta = await api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "alpha")
    assert beta["apiVersion"] == f"{SBX}/v1beta1" and beta["spec"]["operatingMode"] == "Suspended"
    assert "replicas" not in beta["spec"]
    await api.patch_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "alpha",
                                             {"spec": {"operatingMode": "Running"}}, _content_type=MERGE)
    alpha = await api.get_namespaced_custom_object(SBX, "v1alpha1", NS, "sandboxes", "alpha")
    assert alpha["spec"]["replicas"] == 1 and "operatingMode" not in alpha["spec"]
    assert not any(k.startswith("api.agents.x-k8s.io/") for k in alpha["metadata"].get("annotations", {}))

    await api.create_namespaced_custom_object(EXT, "v1alpha1", NS, "sandboxclaims", ext(
        "SandboxClaim", "c-alpha", "v1alpha1", {"sandboxTemplateRef": {"name": "tpl"}}))
    claim = await api.get_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims", "c-alpha")
    assert claim["spec"]["warmPoolRef"] == {"name": "shadow-pool-tpl"} and "sandboxTemplateRef" not in claim["spec"]
    back = await api.get_namespaced_custom_object(EXT, "v1alpha1", NS, "sandboxclaims", "c-alpha")
    assert back["spec"]["sandboxTemplateRef"] == {"name": "tpl"} and back["spec"]["warmpool"] == "default"
    # v1beta1 requires warmPoolRef; v1alpha1 requires sandboxTemplateRef
    await expect_error(422, api.create_namespaced_custom_object(EXT, "v1beta1", NS, "sandboxclaims", ext(
        "SandboxClaim", "c-beta", "v1beta1", {"sandboxTemplateRef": {"name": "tpl"}})))


async def test_v10_serves_v1beta1_only(fake_kube: FakeKube, api: client.CustomObjectsApi) -> None:
    """agent-sandbox v1.0, the default: v1alpha1 and its conversion are gone from every group."""
    assert fake_kube.crd_set == "v1.0"
    for group, plural in ((SBX, "sandboxes"), (EXT, "sandboxclaims"), (EXT, "sandboxtemplates"),
                          (EXT, "sandboxwarmpools")):
        await expect_error(404, api.list_namespaced_custom_object(group, "v1alpha1", NS, plural))
        assert (await api.list_namespaced_custom_object(group, "v1beta1", NS, plural))["items"] == []
    await expect_error(404, api.create_namespaced_custom_object(SBX, "v1alpha1", NS, "sandboxes",
                                                                sandbox("old", "v1alpha1", replicas=1)))
    groups = await client.ApisApi(api.api_client).get_api_versions()
    assert {g.name: [v.version for v in g.versions] for g in groups.groups} == {SBX: ["v1beta1"], EXT: ["v1beta1"]}


async def test_v046_serves_v1alpha1_only(make_fake_kube: Any) -> None:
    kube = await make_fake_kube("v0.4.6")
    api = client.CustomObjectsApi(await kube.api_client())
    await expect_error(404, api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes"))
    await expect_error(422, api.create_namespaced_custom_object(EXT, "v1alpha1", NS, "sandboxwarmpools", ext(
        "SandboxWarmPool", "p", "v1alpha1", {"sandboxTemplateRef": {"name": "t"}})))  # replicas required
    groups = await client.ApisApi(api.api_client).get_api_versions()
    assert {g.name: [v.version for v in g.versions] for g in groups.groups} == {SBX: ["v1alpha1"], EXT: ["v1alpha1"]}


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


# --- schema keywords the vendored CRDs do not exercise (checked directly, no HTTP) -----------------

EMBEDDED = {"type": "object", "x-kubernetes-embedded-resource": True, "properties": {"spec": {"type": "object"}}}
PRESERVE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"known": {"type": "integer"}}}
QUANTITY = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": "^[0-9]+m?$"}


@pytest.mark.parametrize(("schema", "value", "normalized", "unknown", "error_fields"), [
    pytest.param(PRESERVE, {"known": 1.0, "extra": {"x": 1}}, {"known": 1, "extra": {"x": 1}}, [], [],
                 id="preserve-unknown-fields keeps extras; 1.0 is an integer"),
    pytest.param(PRESERVE, {"known": "1"}, {"known": "1"}, [], ["known"], id="preserved object still typed"),
    pytest.param(EMBEDDED, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "zzz": 1}, "spec": {}},
                 {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}, ["metadata.zzz"], [],
                 id="embedded resource keeps apiVersion/kind/ObjectMeta"),
    pytest.param(EMBEDDED, {"spec": {}}, {}, [], ["apiVersion", "kind"], id="embedded resource needs apiVersion/kind"),
    pytest.param({"type": "object", "properties": {"q": QUANTITY}}, {"q": 5}, {"q": 5}, [], [], id="int-or-string int"),
    pytest.param({"type": "object", "properties": {"q": QUANTITY}}, {"q": "5x"}, {"q": "5x"}, [], ["q"],
                 id="int-or-string pattern"),
    pytest.param({"type": "object", "properties": {"q": QUANTITY}}, {"q": True}, {"q": True}, [], ["q"],
                 id="int-or-string rejects bool"),
    pytest.param({"type": "object", "properties": {"a": {"type": "string", "default": "d"}}}, {"a": None},
                 {"a": "d"}, [], [], id="null of a non-nullable field is pruned, then defaulted"),
])
def test_schema_keywords(schema: Obj, value: Obj, normalized: Obj, unknown: list[str],
                         error_fields: list[str]) -> None:
    pruned: list[str] = []
    result = normalize(schema, value, "", pruned)
    assert {k: v for k, v in result.items() if k != "spec"} == normalized and pruned == unknown
    assert [e.field for e in validate(schema, result)] == error_fields
