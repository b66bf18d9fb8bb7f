"""The fake kube-apiserver (tests/fakekube), driven only through the real kubernetes_asyncio client."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.fakekube.fixtures import FakeKube, fake_kube, make_fake_kube  # noqa: F401
from tests.fakekube.helpers import EXT, SBX, Obj, Waiter, ext, ready, sandbox
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
