"""The fake apiserver's misbehaviour (tests/fakekube/faults.py), seen through the real client:
each fault is what a real cluster answers, and each goes away when it should."""

from __future__ import annotations

import asyncio
import json
import math

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.fakekube.api import HOLD_FINALIZER
from tests.fakekube.fixtures import FakeKube
from tests.fakekube.helpers import SBX, sandbox

NS = "default"


async def api_of(kube: FakeKube) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(await kube.api_client())


@pytest.mark.parametrize(("status", "reason"), [(429, "TooManyRequests"), (500, "InternalError"),
                                                (503, "ServiceUnavailable")])
async def test_an_injected_status_answers_that_many_requests_then_the_real_answer(make_fake_kube, status, reason):
    kube = await make_fake_kube()
    api = await api_of(kube)
    kube.server.faults.inject(status=status, retry_after=2, times=2, method="POST")
    for _ in range(2):
        with pytest.raises(ApiException) as info:
            await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("a"))
        assert info.value.status == status
        assert info.value.headers["Retry-After"] == "2"
        assert json.loads(info.value.body)["reason"] == reason
    assert kube.server.get_object("sandboxes", NS, "a") is None  # refused: nothing was stored
    await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("a"))
    assert kube.server.create_count("sandboxes", NS, "a") == 1
    assert kube.server.faults.served[str(status)] == 2


async def test_a_fault_narrowed_to_watches_leaves_other_calls_alone(make_fake_kube):
    kube = await make_fake_kube()
    api = await api_of(kube)
    kube.server.faults.inject(status=500, watch=True, times=None)
    await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes")  # not a watch: answered
    response = await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", watch=True,
                                                       _preload_content=False)
    assert response.status == 500  # a non-200 watch: a Status body, no event stream
    assert json.loads(await response.read())["code"] == 500
    response.release()
    kube.server.faults.clear()
    response = await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", watch=True,
                                                       timeout_seconds=1, _preload_content=False)
    assert response.status == 200
    response.release()


async def test_a_dropped_connection_is_a_connection_error(make_fake_kube):
    """Before the request is carried out (nothing stored) or after (stored, unanswered). POST, since
    aiohttp tries an idempotent request once more on a dropped keep-alive connection by itself."""
    kube = await make_fake_kube()
    api = await api_of(kube)
    kube.server.faults.inject(drop=True, method="POST")
    with pytest.raises(aiohttp.ClientError):
        await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("a"))
    assert kube.server.get_object("sandboxes", NS, "a") is None
    kube.server.faults.inject(drop_after=True, method="POST")
    with pytest.raises(aiohttp.ClientError):
        await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("a"))
    assert kube.server.get_object("sandboxes", NS, "a") is not None  # stored, though nobody was told
    assert kube.server.faults.served["drop"] == 2
    with pytest.raises(ApiException) as info:  # the next request is answered
        await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("a"))
    assert info.value.status == 409


async def test_a_stall_holds_the_request_until_the_clients_timeout(make_fake_kube):
    kube = await make_fake_kube()
    api = await api_of(kube)
    kube.server.faults.inject(stall=math.inf)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(asyncio.TimeoutError):
        await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", _request_timeout=(1, 0.3))
    assert 0.25 < loop.time() - began < 5
    assert kube.server.faults.served["stall"] == 1


async def test_a_restart_cuts_watches_loses_their_cache_and_refuses_for_a_while(make_fake_kube):
    kube = await make_fake_kube()
    api = await api_of(kube)
    created = await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("a"))
    response = await api.list_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", watch=True,
                                                       _preload_content=False)
    await kube.server.wait_for_watchers(1)
    kube.server.restart(down_for=0.5)
    with pytest.raises(aiohttp.ClientError):
        async for _ in response.content:
            pass
    response.release()
    with pytest.raises(aiohttp.ClientError):  # down: the connection is dropped
        await api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "a")
    await asyncio.sleep(0.6)
    response = await api.list_namespaced_custom_object(
        SBX, "v1beta1", NS, "sandboxes", watch=True, resource_version=created["metadata"]["resourceVersion"],
        _preload_content=False)
    event = json.loads(await response.content.readline())
    response.release()
    assert event["type"] == "ERROR" and event["object"]["code"] == 410  # the watch cache was lost


async def test_a_held_deletion_keeps_the_object_terminating_then_it_goes(make_fake_kube):
    kube = await make_fake_kube()
    api = await api_of(kube)
    kube.server.api.deletion_delay["sandboxes"] = 0.3
    await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("a"))
    await api.delete_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "a")
    terminating = await api.get_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", "a")
    assert terminating["metadata"]["deletionTimestamp"] and HOLD_FINALIZER in terminating["metadata"]["finalizers"]
    with pytest.raises(ApiException) as info:  # the name is still taken
        await api.create_namespaced_custom_object(SBX, "v1beta1", NS, "sandboxes", sandbox("a"))
    assert info.value.status == 409
    gone = asyncio.Event()
    kube.server.store.subscribe(lambda e: gone.set() if e.type == "DELETED" and e.name == "a" else None)
    await asyncio.wait_for(gone.wait(), 5)
    assert kube.server.get_object("sandboxes", NS, "a") is None


async def test_delayed_garbage_collection_keeps_dependents_for_a_while(make_fake_kube):
    """A claim's Sandbox outlives the claim until the garbage collector runs."""
    from tests.test_kubernetes import seed_templates
    kube = await make_fake_kube()
    await seed_templates(kube, "v1beta1")
    kube.server.api.gc_delay = 0.3
    api = await api_of(kube)
    ext = "extensions.agents.x-k8s.io"
    await api.create_namespaced_custom_object(ext, "v1beta1", NS, "sandboxclaims", {
        "apiVersion": f"{ext}/v1beta1", "kind": "SandboxClaim", "metadata": {"name": "c"},
        "spec": {"warmPoolRef": {"name": "warm"}}})
    claim = await kube.server.wait_for_object("sandboxclaims", NS, "c",
                                              lambda o: bool((o.get("status") or {}).get("sandbox")))
    held = claim["status"]["sandbox"]["name"]
    await api.delete_namespaced_custom_object(ext, "v1beta1", NS, "sandboxclaims", "c")
    assert kube.server.get_object("sandboxes", NS, held) is not None  # not collected yet
    gone = asyncio.Event()
    kube.server.store.subscribe(lambda e: gone.set() if e.type == "DELETED" and e.name == held else None)
    await asyncio.wait_for(gone.wait(), 5)
