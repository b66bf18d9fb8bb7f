"""Kubernetes pools under load through a misbehaving apiserver (issue #30's chaos test).

Sessions are resolved through the real SessionRouter (its store reservation is what keeps a create
exactly-once across callers) against the fake apiserver, while it throttles (429 + Retry-After on a
share of calls), fails (503), drops connections before and after carrying a create out, restarts
(watches cut, watch cache lost, connections refused for a while), holds deletions with a finalizer
and collects garbage late. Sandbox mode and claim mode, provisioning, then suspend and wake.

Every request a retry within its deadline could save is served; afterwards the cluster holds
exactly the objects the store knows (0 orphans), each annotated with its own session's owner
(0 wrong owner), each created once by the gateway (0 created twice); and the API connections
stay bounded by namespaces x kinds plus the client's pool while 400 sandboxes provision at once.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from gateway.providers.base import PoolProviders
from gateway.providers.kubernetes import KubernetesProvider
from gateway.providers.kubernetes_calls import Backoff, Calls
from gateway.sessions import SessionRouter
from gateway.store.memory import MemoryStore
from routing import Identity, parse_policy
from tests.fakekube.fixtures import FakeKube
from tests.test_kubernetes import pool_options, seed_templates

POLICY = parse_policy("pools: {small: {provisioning_timeout: 30s, wake_timeout: 30s}, shared: {}}\n"
                      "routing: {per_session_orgs: ['*']}", "chaos")


def misbehave(kube: FakeKube) -> None:
    faults = kube.server.faults
    faults.inject(status=429, retry_after=0.2, fraction=0.15, times=None, watch=False)
    faults.inject(status=503, fraction=0.05, times=None, watch=False)
    faults.inject(drop=True, method="POST", fraction=0.05, times=None)
    faults.inject(drop_after=True, method="POST", fraction=0.05, times=None)
    faults.inject(status=500, watch=True, times=2)  # the first watches answer 500 (again after each restart)
    kube.server.api.deletion_delay["sandboxes"] = 0.3
    kube.server.api.deletion_delay["sandboxclaims"] = 0.3
    kube.server.api.gc_delay = 0.3


async def routed(kube: FakeKube, mode: str) -> tuple[KubernetesProvider, SessionRouter]:
    options = pool_options(mode, "v1beta1", 8888)
    provider = KubernetesProvider({"small": options, "shared": options}, "chaos", api_client=await kube.api_client(),
                                  calls=Calls(backoff=Backoff(base=0.05, cap=1.0), rng=random.Random(30)))
    router = SessionRouter(MemoryStore(), PoolProviders({"small": provider, "shared": provider}), POLICY,
                           replica_id="r")
    await provider.start(router.sandbox_lost)
    return provider, router


async def audit(kube: FakeKube, router: SessionRouter, mode: str, routes: dict[str, object],
                recreated: frozenset[str] = frozenset()) -> None:
    plural = "sandboxclaims" if mode == "claim" else "sandboxes"
    objects = {o["metadata"]["name"]: o for o in kube.server.list_objects(plural, "default")
               if not o["metadata"].get("deletionTimestamp")
               and (o["metadata"].get("labels") or {}).get("sandbox-gateway.io/installation") == "chaos"}
    known = {sid for sid in (r.sandbox_id for r in routes.values())
             if await router.store.get_sandbox(sid) is not None}
    assert set(objects) == known, "orphans or missing objects"
    for session, route in routes.items():
        annotations = objects[route.sandbox_id]["metadata"]["annotations"]
        assert annotations["sandbox-gateway.io/session-id"] == session  # its own owner, no one else's
        assert annotations["sandbox-gateway.io/user-id"] == "alice"
    created = [c.name for c in kube.server.create_calls if c.plural == plural and c.actor == "client"]
    twice = {name for name in created if created.count(name) > 1}
    assert twice == recreated and all(created.count(name) == 2 for name in twice), "a sandbox was created twice"


@pytest.mark.parametrize("mode", ["sandbox", "claim"])
async def test_pools_serve_every_saveable_request_through_faults(make_fake_kube, mode):
    kube = await make_fake_kube(ready_delay=0.1)
    await seed_templates(kube, "v1beta1", warm_replicas=10)
    provider, router = await routed(kube, mode)
    identities = {f"s{i}": Identity.parse(org_id="acme", user_id="alice", session_id=f"s{i}") for i in range(60)}
    try:
        misbehave(kube)
        pending = {s: asyncio.create_task(router.resolve(i)) for s, i in identities.items()}
        await asyncio.sleep(0.3)
        kube.server.restart(down_for=0.3)  # mid-provisioning
        kube.server.faults.inject(status=503, watch=True, times=2)  # and it comes back answering watches 503
        routes = {s: await task for s, task in pending.items()}
        assert len({r.sandbox_id for r in routes.values()}) == 60  # every one served
        await audit(kube, router, mode, routes)

        # suspend a third, then wake them all at once (with a second restart in the middle)
        asleep = list(routes.values())[:20]
        await asyncio.gather(*(router.suspend_sandbox(r.sandbox_id) for r in asleep))
        woken = [asyncio.create_task(router.resolve(identities[s])) for s in list(routes)[:20]]
        await asyncio.sleep(0.2)
        kube.server.restart(down_for=0.2)
        again = await asyncio.gather(*woken)
        assert [w.sandbox_id for w in again] == [r.sandbox_id for r in asleep]
        await audit(kube, router, mode, routes)
        served = kube.server.faults.served
        assert served["429"] and served["503"] >= 2 and served["500"] == 2 and served["drop"] >= 2, served

        # destroyed under faults while finalizers hold the objects, then asked for again at once: each
        # new object is created only once its predecessor is gone (never adopted while terminating)
        ended = list(routes)[40:50]
        for s in ended:
            record = await router.store.get_sandbox(routes[s].sandbox_id)
            await router.lifecycle.destroy(record, reason="idle")
        again = await asyncio.gather(*(router.resolve(identities[s]) for s in ended))
        assert [a.sandbox_id for a in again] == [routes[s].sandbox_id for s in ended]
        await audit(kube, router, mode, routes, frozenset(routes[s].sandbox_id for s in ended))
    finally:
        await provider.close()


async def test_connections_stay_bounded_while_400_sandboxes_provision_at_once(make_fake_kube):
    kube = await make_fake_kube(ready_delay=0.5)
    provider, router = await routed(kube, "sandbox")
    kube.server.faults.inject(status=429, retry_after=0.2, fraction=0.2, times=None, watch=False)
    peak = {"watches": 0, "connections": 0}
    identities = [Identity.parse(org_id="acme", user_id="alice", session_id=f"b{i}") for i in range(400)]
    try:
        pending = [asyncio.create_task(router.resolve(i)) for i in identities]
        while not all(t.done() for t in pending):
            peak["watches"] = max(peak["watches"], kube.server.open_watches)
            peak["connections"] = max(peak["connections"], kube.server.connections)
            await asyncio.sleep(0.02)
        routes = await asyncio.gather(*pending)
        assert len({r.sandbox_id for r in routes}) == 400
        assert peak["watches"] == 1  # namespaces x kinds: one
        assert peak["connections"] <= 100 + 1, peak  # the client's pool plus the watch, never one per sandbox
        created = [c.name for c in kube.server.create_calls if c.actor == "client"]
        assert len(created) == len(set(created)) == 400
    finally:
        await provider.close()
