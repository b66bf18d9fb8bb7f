"""The Kubernetes provider against a misbehaving fake apiserver (tests/fakekube/faults.py): what a
retry within the request's deadline can save is served, exactly once; what it cannot fails before the
deadline and leaves nothing behind; one shared watch per (namespace, kind) however many wait."""

from __future__ import annotations

import asyncio
import math

import pytest
from kubernetes_asyncio import client

from gateway.errors import ProvisionFailed, ProvisionTimeout
from gateway.providers.base import Probe
from gateway.providers.kubernetes import KubernetesProvider
from gateway.providers.kubernetes_calls import Calls
from tests.fakekube.fixtures import FakeKube
from tests.test_kubernetes import pool_options, request, seed_templates

SBX = "agents.x-k8s.io"


async def started(kube: FakeKube, mode: str = "sandbox", port: int = 8888, **calls: float) -> KubernetesProvider:
    provider = KubernetesProvider({"k8s": pool_options(mode, "v1beta1", port)}, "test",
                                  api_client=await kube.api_client(), calls=Calls(**calls))
    lost: list[str] = []
    provider.lost = lost  # type: ignore[attr-defined]  # test bookkeeping
    await provider.start(lost.append)
    return provider


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_a_refused_create_is_retried_after_retry_after_and_created_once(make_fake_kube, status):
    kube = await make_fake_kube()
    provider = await started(kube)
    loop = asyncio.get_running_loop()
    try:
        kube.server.faults.inject(status=status, retry_after=0.4, times=2, method="POST")
        began = loop.time()
        endpoint = await provider.ensure(request("ses-429"))
        assert endpoint.host == "127.0.0.1"
        assert loop.time() - began >= 0.8  # Retry-After honoured twice, never sooner
        assert kube.server.faults.served[str(status)] == 2
        assert kube.server.create_count("sandboxes", "default", "ses-429") == 1
    finally:
        await provider.close()


async def test_a_retry_after_past_the_deadline_fails_at_once_and_leaves_nothing(make_fake_kube):
    kube = await make_fake_kube()
    provider = await started(kube)
    loop = asyncio.get_running_loop()
    try:
        kube.server.faults.inject(status=429, retry_after=30, times=None, method="POST")
        began = loop.time()
        with pytest.raises(ProvisionFailed) as info:
            await provider.ensure(request("ses-late", timeout=5))
        assert loop.time() - began < 2  # not slept on: the deadline could not be met
        assert "429" in info.value.message and "within its deadline" in info.value.message
        assert kube.server.list_objects("sandboxes", "default") == []
    finally:
        await provider.close()


async def test_a_create_whose_answer_is_lost_is_adopted_not_created_twice(make_fake_kube):
    kube = await make_fake_kube()
    provider = await started(kube)
    try:
        kube.server.faults.inject(drop_after=True, method="POST")
        assert (await provider.ensure(request("ses-lost-answer"))).host == "127.0.0.1"
        assert kube.server.faults.served["drop"] == 1
        assert kube.server.create_count("sandboxes", "default", "ses-lost-answer") == 1
    finally:
        await provider.close()


@pytest.mark.parametrize("status", [500, 403])
async def test_a_non_200_watch_is_retried_with_backoff_not_a_crash(make_fake_kube, status):
    """Today's KeyError: 'type'. The shared watch backs off (a handful of tries, not thousands) and,
    once the apiserver answers, the sandbox is served."""
    kube = await make_fake_kube()
    kube.server.faults.inject(status=status, watch=True, times=None)
    provider = await started(kube)
    try:
        pending = asyncio.create_task(provider.ensure(request("ses-watch500")))
        await kube.server.wait_for_object("sandboxes", "default", "ses-watch500", lambda o: bool(
            (o.get("status") or {}).get("podIPs")))
        await asyncio.sleep(1.0)
        refused = kube.server.faults.served[str(status)]
        assert 2 <= refused < 30  # retried, backing off: no reconnect storm
        kube.server.faults.clear()
        assert (await asyncio.wait_for(pending, 15)).host == "127.0.0.1"
    finally:
        await provider.close()


async def test_a_watch_that_never_answers_200_times_out_and_the_object_is_deleted(make_fake_kube):
    kube = await make_fake_kube()
    kube.server.faults.inject(status=500, watch=True, times=None)
    provider = await started(kube)
    try:
        async with asyncio.timeout(10):
            while not kube.server.faults.served["500"]:  # listed, and now the watch is refused
                await asyncio.sleep(0.01)
        with pytest.raises(ProvisionTimeout):
            await provider.ensure(request("ses-blind", timeout=0.5))
        assert kube.server.get_object("sandboxes", "default", "ses-blind") is None
    finally:
        await provider.close()


async def test_a_stalled_apiserver_is_a_timeout_not_a_hang(make_fake_kube):
    kube = await make_fake_kube()
    provider = await started(kube, read_timeout=0.3, background_budget=3)
    loop = asyncio.get_running_loop()
    try:
        await provider.ensure(request("ses-stall"))
        kube.server.faults.inject(stall=math.inf, times=None, watch=False)
        began = loop.time()
        assert await provider.probe("ses-stall", "k8s") is Probe.UNKNOWN
        assert loop.time() - began < 4  # bounded by the background budget, each try by the read timeout
        assert kube.server.faults.served["stall"] >= 2  # retried after each read timeout
    finally:
        kube.server.faults.clear()
        await provider.close()


async def test_provisions_survive_an_apiserver_restart(make_fake_kube):
    """Watches cut, the watch cache lost (410: relist), connections refused for a while: every
    provision in flight within its deadline is served, each created once."""
    kube = await make_fake_kube(ready_delay=0.3)
    provider = await started(kube)
    try:
        pending = [asyncio.create_task(provider.ensure(request(f"ses-r{i}", timeout=20))) for i in range(20)]
        await kube.server.wait_for_watchers(1)
        await asyncio.sleep(0.1)
        kube.server.restart(down_for=0.5)
        endpoints = await asyncio.gather(*pending)
        assert len(endpoints) == 20
        assert all(kube.server.create_count("sandboxes", "default", f"ses-r{i}") == 1 for i in range(20))
    finally:
        await provider.close()


async def test_a_terminating_object_is_waited_out_never_adopted(make_fake_kube):
    """A finalizer holds the deleted Sandbox: probe says GONE (never ALIVE), and ensure waits for it
    to go by watch, then creates a new one."""
    kube = await make_fake_kube()
    kube.server.api.deletion_delay["sandboxes"] = 0.5
    provider = await started(kube)
    try:
        await provider.ensure(request("ses-term"))
        old = kube.server.get_object("sandboxes", "default", "ses-term")["metadata"]["uid"]
        await provider.delete("ses-term", "k8s")
        assert kube.server.get_object("sandboxes", "default", "ses-term")["metadata"]["deletionTimestamp"]
        assert await provider.probe("ses-term", "k8s") is Probe.GONE
        await provider.ensure(request("ses-term"))
        new = kube.server.get_object("sandboxes", "default", "ses-term")
        assert new["metadata"]["uid"] != old and not new["metadata"].get("deletionTimestamp")
        assert kube.server.create_count("sandboxes", "default", "ses-term") == 2
    finally:
        await provider.close()


async def test_a_claim_recreated_while_its_sandbox_is_garbage_collected_is_served(make_fake_kube):
    """v1alpha1 claims name their Sandbox like the claim: until the garbage collector removes the old
    one, the claim reports ReconcilerError, which is waited out, not terminal."""
    kube = await make_fake_kube("head")
    await seed_templates(kube, "v1alpha1")
    kube.server.api.gc_delay = 0.5
    options = pool_options("claim", "v1alpha1", 8888, warm_pool="none")
    provider = KubernetesProvider({"k8s": options}, "test", api_client=await kube.api_client())
    await provider.start(lambda name: None)
    try:
        await provider.ensure(request("ses-gc"))
        await provider.delete("ses-gc", "k8s")
        assert kube.server.get_object("sandboxes", "default", "ses-gc") is not None  # not collected yet
        assert (await provider.ensure(request("ses-gc"))).host
        assert kube.server.create_count("sandboxclaims", "default", "ses-gc") == 2
    finally:
        await provider.close()


async def test_connections_stay_bounded_while_many_sandboxes_provision(make_fake_kube):
    """One watch per (namespace, kind), whatever the number of waiters: 200 provisions in flight hold
    one watch, and the client's connections stay far below one per sandbox."""
    kube = await make_fake_kube(ready_delay=0.5)
    provider = await started(kube)
    peak = {"watches": 0, "connections": 0}
    try:
        pending = [asyncio.create_task(provider.ensure(request(f"ses-b{i}", timeout=60))) for i in range(200)]
        while not all(t.done() for t in pending):
            peak["watches"] = max(peak["watches"], kube.server.open_watches)
            peak["connections"] = max(peak["connections"], kube.server.connections)
            await asyncio.sleep(0.02)
        await asyncio.gather(*pending)
        assert peak["watches"] == 1
        assert peak["connections"] <= 101  # the client's pool (100) plus the watch: never one each
    finally:
        await provider.close()


async def test_lost_sandboxes_are_still_reported_after_a_relist(make_fake_kube):
    """A deletion missed while the watch was down (history lost) is found by the relist on 410."""
    kube = await make_fake_kube()
    provider = await started(kube)
    try:
        await provider.ensure(request("ses-missed"))
        await kube.server.wait_for_watchers(1)
        kube.server.restart()
        api = client.CustomObjectsApi(await kube.api_client())
        await api.delete_namespaced_custom_object(SBX, "v1beta1", "default", "sandboxes", "ses-missed")
        kube.server.compact()
        async with asyncio.timeout(10):
            while provider.lost != ["ses-missed"]:
                await asyncio.sleep(0.05)
    finally:
        await provider.close()


async def test_api_calls_and_watch_restarts_are_counted_and_readiness_follows_the_api(make_fake_kube):
    """sgw_kube_requests_total{verb,resource,code}, its latency histogram and
    sgw_kube_watch_restarts_total{reason}; /readyz's problem once every call for the grace was
    refused (403 here: a Role that lost a verb), gone with the next answered call."""
    from gateway.metrics import Metrics
    from gateway.providers.kubernetes_calls import KubeObserver

    kube = await make_fake_kube()
    metrics = Metrics()
    provider = KubernetesProvider({"k8s": pool_options("sandbox", "v1beta1", 8888)}, "test",
                                  api_client=await kube.api_client(),
                                  observer=KubeObserver(metrics.kube_request, metrics.kube_watch_restart))
    await provider.start(lambda name: None)
    sample = metrics.registry.get_sample_value
    try:
        kube.server.faults.inject(status=429, retry_after=0.1, method="POST")
        await provider.ensure(request("ses-m"))
        # the startup check's dry run, the 429 and the create
        assert sample("sgw_kube_requests_total", {"verb": "create", "resource": "sandboxes", "code": "429"}) == 1
        assert sample("sgw_kube_requests_total", {"verb": "create", "resource": "sandboxes", "code": "200"}) == 2
        assert sample("sgw_kube_request_duration_seconds_count", {"verb": "create", "resource": "sandboxes"}) == 3
        assert sample("sgw_kube_requests_total", {"verb": "watch", "resource": "sandboxes", "code": "200"}) >= 1
        kube.server.drop_watches()
        async with asyncio.timeout(10):
            while not sample("sgw_kube_watch_restarts_total", {"reason": "dropped"}):
                await asyncio.sleep(0.02)
        assert provider.readiness_problem(0.2) is None
        kube.server.faults.inject(status=403, times=None)
        kube.server.drop_watches()
        assert await provider.probe("ses-m", "k8s") is Probe.UNKNOWN
        await asyncio.sleep(0.3)
        assert await provider.probe("ses-m", "k8s") is Probe.UNKNOWN
        problem = provider.readiness_problem(0.2)
        assert problem is not None and "kube_api_grace" in problem and "403" in problem
        kube.server.faults.clear()
        assert await provider.probe("ses-m", "k8s") is Probe.ALIVE
        assert provider.readiness_problem(0.2) is None
    finally:
        await provider.close()


async def test_a_typo_in_a_pod_template_is_refused_naming_the_field(make_fake_kube):
    """Creates are strict: the apiserver's 400 names the unknown field (it was pruned in silence). Here
    the startup check could not run (its dry run was refused: a warning, and startup goes on)."""
    kube = await make_fake_kube()
    options = pool_options("sandbox", "v1beta1", 8888).model_copy(update={"volume_claim_templates": [
        {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resource": {}}}]})
    provider = KubernetesProvider({"k8s": options}, "test", api_client=await kube.api_client())
    kube.server.faults.inject(status=403, method="POST")
    await provider.start(lambda name: None)
    try:
        with pytest.raises(ProvisionFailed) as info:
            await provider.ensure(request("ses-typo"))
        assert "400" in info.value.message and 'unknown field "spec.volumeClaimTemplates[0].spec.resource"' \
            in info.value.message, info.value.message
        assert kube.server.get_object("sandboxes", "default", "ses-typo") is None
    finally:
        await provider.close()


async def test_suspend_and_wake_while_pods_take_time_to_go(make_fake_kube):
    """A suspended Sandbox's pod terminates for a while (its deletion held by a finalizer, as a
    grace period does); suspend returns once the Sandbox is no longer routable and a wake right
    after it is served."""
    kube = await make_fake_kube()
    kube.server.api.deletion_delay["pods"] = 0.5
    provider = await started(kube)
    try:
        await provider.ensure(request("ses-pod"))
        await provider.suspend("ses-pod", "k8s")
        pod = kube.server.get_object("pods", "default", "ses-pod")
        assert pod is not None and pod["metadata"]["deletionTimestamp"]  # still terminating
        assert await provider.probe("ses-pod", "k8s") is not Probe.ALIVE
        assert (await provider.resume(request("ses-pod"))).host == "127.0.0.2"
    finally:
        await provider.close()


async def test_a_pod_template_typo_stops_startup_naming_the_pool_and_the_field(make_fake_kube):
    """At startup each sandbox pool's object is created as a strict server-side dry run: nothing is
    stored, and a field the cluster's schema does not know stops the provider before any request."""
    from routing import PolicyError

    kube = await make_fake_kube()
    options = pool_options("sandbox", "v1beta1", 8888).model_copy(update={"pod_template": {
        "spec": {"containers": [{"name": "runtime", "image": "runtime:1", "resource": {}}]}}})
    provider = KubernetesProvider({"gpu": options}, "test", api_client=await kube.api_client())
    try:
        with pytest.raises(PolicyError) as info:
            await provider.start(lambda name: None)
        [error] = info.value.errors
        assert error.startswith("pools.gpu.kubernetes: the cluster refuses this pool's Sandbox")
        assert 'unknown field "spec.podTemplate.spec.containers[0].resource"' in error, error
        assert kube.server.list_objects("sandboxes", "default") == [] and not kube.server.create_calls
    finally:
        await provider.close()


async def test_readyz_of_a_real_serve_follows_the_kubernetes_api(make_fake_kube, tmp_path):
    """A `serve` whose every Kubernetes API call is refused (403: its Role lost the verbs) leaves the
    Service once kube_api_grace has passed, and comes back once the API answers again."""
    import aiohttp
    import yaml

    from tests.gateway_process import GatewayProcess
    from tests.test_kubernetes import POD_TEMPLATE

    kube = await make_fake_kube()
    pool = {"provider": "kubernetes", "kubernetes": {"namespace": "default", "mode": "sandbox", "port": 8888,
                                                     "pod_template": POD_TEMPLATE}}
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"pools": {"small": pool, "shared": pool}}))
    gateway = await GatewayProcess(tmp_path / "gw", "--policy", str(policy), "--data-dir", str(tmp_path / "data"),
                                   env={"SANDBOX_GATEWAY_KUBECONFIG": str(kube.kubeconfig_path),
                                        "SANDBOX_GATEWAY_KUBE_API_GRACE": "0.5",
                                        "SANDBOX_GATEWAY_DRAIN_TIMEOUT": "1"}).start()
    try:
        async with aiohttp.ClientSession() as http:
            async def ready() -> tuple[int, dict]:
                async with http.get(f"{gateway.control_url}/readyz") as response:
                    return response.status, await response.json()

            assert (await ready())[0] == 200
            kube.server.faults.inject(status=403, times=None)
            kube.server.drop_watches()  # the shared watch comes back, refused
            async with asyncio.timeout(30):
                while (status := await ready())[0] == 200:
                    await asyncio.sleep(0.2)  # polling the endpoint under test: there is no event to await
            assert status[0] == 503 and any("kube_api_grace" in p for p in status[1]["problems"]), status
            kube.server.faults.clear()
            async with asyncio.timeout(30):
                while (await ready())[0] != 200:
                    await asyncio.sleep(0.2)
    finally:
        await gateway.stop()


def test_retry_after_is_read_in_seconds_or_as_an_http_date_and_backoff_is_jittered_within_its_cap():
    import email.utils
    import random
    import time

    from kubernetes_asyncio.client.exceptions import ApiException

    from gateway.providers.kubernetes_calls import Backoff, retry_after

    def refused(value: str | None) -> ApiException:
        exc = ApiException(status=429, reason="TooManyRequests")
        exc.headers = {} if value is None else {"Retry-After": value}
        return exc

    assert retry_after(refused("3")) == 3.0
    assert retry_after(refused(None)) is None and retry_after(refused("soon")) is None
    in_ten = retry_after(refused(email.utils.formatdate(time.time() + 10, usegmt=True)))
    assert in_ten is not None and 8 < in_ten <= 10
    rng = random.Random(1)
    delays = [Backoff(base=0.1, cap=5.0).delay(attempt, rng) for attempt in range(12) for _ in range(50)]
    assert all(0 <= d <= 5.0 for d in delays) and max(delays) > 4  # capped, and spread (full jitter)
    assert len({round(d, 3) for d in delays[:50]}) > 25  # the first try's pauses are spread too, not one value


async def test_a_throttled_watch_waits_for_its_retry_after(make_fake_kube):
    """API Priority and Fairness refuses the watch with 429 + Retry-After: the shared watch waits that
    long before asking again, however short its own backoff would be."""
    kube = await make_fake_kube()
    provider = await started(kube)
    try:
        await kube.server.wait_for_watchers(1)
        kube.server.faults.inject(status=429, retry_after=1.0, watch=True, times=None)
        kube.server.drop_watches()
        await asyncio.sleep(2.2)
        assert 1 <= kube.server.faults.served["429"] <= 3  # at most one try a second, not a storm
    finally:
        kube.server.faults.clear()
        await provider.close()
