"""Sandboxes as kubernetes-sigs/agent-sandbox objects, ready by watch.

Per pool: a namespace, an API version (``v1beta1``, the only one agent-sandbox v1.0 serves and
the default, or ``v1alpha1`` for v0.4/v0.5 controllers) and a mode:
``sandbox`` creates a ``Sandbox`` (agents.x-k8s.io) from the pool's pod template;
``claim`` creates a ``SandboxClaim`` (extensions.agents.x-k8s.io) against the
pool's SandboxTemplate or warm pool. The object is named by the sandbox ID (52
chars, a valid DNS label) and labelled as ours; identity goes into annotations
because label values cannot hold arbitrary strings. Those annotations are the
sandbox's owner: an existing object is adopted only by the same owner
(``_check_owner``), never handed to another identity.

Readiness is watched, never polled, through one shared watch per (namespace, kind)
(``kubernetes_watch.Informer``: list, watch with bookmarks, relist on 410, backoff
with jitter), so API connections do not grow with sandboxes in flight. Every call
is retried where a retry can save it, within the request's own deadline
(``kubernetes_calls``). An object being deleted (``deletionTimestamp``) is never
adopted or routed to: ensure waits for it to go, then creates.
Routable means ``Ready=True`` *and* a pod IP: old controllers report Ready for
``replicas: 0``. Terminal reasons fail at once and delete the object; a
provisioning timeout deletes it too (504).

Suspend and resume act on the ``Sandbox`` (for a claim pool: the Sandbox the claim
names in ``status.sandbox.name``): ``spec.operatingMode: Suspended``/``Running`` at
v1beta1, ``spec.replicas: 0``/``1`` at v1alpha1, by merge patch. Suspend returns once
the object is no longer routable (its pod gone); resume waits by watch exactly as
creation does (the pod IP changes), and for the Ready condition to have observed the
patched generation, so a stale status from before the suspend is never taken for
the new pod. An object deleted while suspended is created anew by resume (its files
are gone, as after any lost sandbox); resume never deletes on failure or timeout,
since the files (PVCs) are the point of suspending.

The same watch over every object of this installation notices sandboxes that
are deleted or lose their pod and reports them through ``on_lost`` (a Sandbox
whose spec says suspended is not lost).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client

from gateway.errors import Conflict, KubeApiError, ProvisionFailed, ProvisionTimeout
from gateway.model import Endpoint, ManagedSandbox, Owner, SandboxRequest
from routing import Isolation, PolicyError
from gateway.providers.base import ForeignSandbox, LostHandler, ManagedPage, Probe
from gateway.providers.kubernetes_api import (
    ANNOTATION, INSTALLATION, ISOLATION, MANAGED_BY, MERGE_PATCH, POOL, SUSPEND_WAIT, Kind, ObjectExists, ObjectMissing,
    WatchExpired, api_client, mode_patch, observed, pod_ips, routable, sandbox_kind, suspended_spec, terminal_failure,
    terminating,
)
from gateway.providers.kubernetes_calls import Calls, KubeObserver
from gateway.providers.kubernetes_watch import Informer, Obj
from gateway.providers.kubernetes_options import KubernetesPoolOptions, pool_options

log = logging.getLogger(__name__)

#: Creates tried when each one finds the name taken and the read after it finds it free again (a delete raced us).
_CREATE_ATTEMPTS = 3
#: Creates are strict: an unknown field in a pool's template is an error naming it, never pruned in silence.
_STRICT = "Strict"


class KubernetesProvider:
    def __init__(self, pools: Mapping[str, KubernetesPoolOptions], installation: str, *,
                 kubeconfig: str | None = None, in_cluster: bool = False,
                 api_client: client.ApiClient | None = None, observer: KubeObserver | None = None,
                 calls: Calls | None = None) -> None:
        self._pools = dict(pools)
        self._installation = installation
        self._kubeconfig = kubeconfig
        self._in_cluster = in_cluster
        self._api_client = api_client
        self._owns_client = api_client is None
        self._calls = calls or Calls(observer)
        self._informers: dict[tuple[str, Kind, str | None], Informer] = {}
        self._on_lost: LostHandler | None = None
        # Names the managed watch has seen routable. Only that watch's own (ordered) stream
        # writes it: ensure() must not, or the watch's older, not-yet-ready events for the same
        # object (it may lag the per-object watch) would read as a sandbox that was lost.
        self._routable: set[str] = set()

    @classmethod
    def from_policy(cls, settings: Any, policy: Any, pool_names: Sequence[str],
                    observer: KubeObserver | None = None) -> KubernetesProvider:
        return cls(pool_options(policy, pool_names), settings.installation, kubeconfig=settings.kubeconfig,
                   in_cluster=settings.in_cluster, observer=observer)

    def readiness_problem(self, grace: float) -> str | None:
        """Why ``/readyz`` should fail: the API unanswered, 5xx or refusing our credentials for ``grace``."""
        if self._calls.observer.healthy(grace):
            return None
        return (f"kubernetes: every API call for {grace:g}s or more was unanswered, a server error or refused "
                f"(401/403); check the API server, the NetworkPolicy's egress and the service account's Role "
                f"(setting kube_api_grace)")

    @property
    def observer(self) -> KubeObserver:
        """API health (``/readyz``) and the metric hooks of every call this provider makes."""
        return self._calls.observer

    @property
    def _api(self) -> client.CustomObjectsApi:
        assert self._api_client is not None, "start() first"
        return client.CustomObjectsApi(self._api_client)

    async def start(self, on_lost: LostHandler) -> None:
        if self._api_client is None:
            self._api_client = await api_client(self._kubeconfig, in_cluster=self._in_cluster)
        self._on_lost = on_lost
        await self._check_templates()
        targets = {(o.namespace, Kind.of(o)) for o in self._pools.values()}
        for namespace, kind in sorted(targets, key=str):
            self._informer(namespace, kind, self._selector()).listen(self._on_managed)

    async def close(self) -> None:
        for informer in self._informers.values():
            await informer.stop()
        if self._owns_client and self._api_client is not None:
            await self._api_client.close()

    async def _check_templates(self) -> None:
        """Each sandbox pool's object, created once as a server-side dry run (nothing is stored) with
        strict field validation: a typo in a pool's ``pod_template`` stops startup naming the pool and
        the field, instead of failing every create later. An API that does not answer here is left to
        the retries of real requests (and to ``/readyz``)."""
        for name, pool in self._pools.items():
            if pool.mode != "sandbox":
                continue  # a claim carries no template of ours
            kind = Kind.of(pool)
            probe = SandboxRequest("sgw-template-check", name, Isolation.SHARED, Owner(None, "check", None), "check", 10)
            body = self._manifest(pool, kind, probe)
            try:
                await self._calls.call(
                    "create", kind.plural, f"checking pools.{name}.kubernetes (a dry-run create)",
                    lambda timeout, body=body, kind=kind, pool=pool: self._api.create_namespaced_custom_object(
                        kind.group, kind.version, pool.namespace, kind.plural, body, dry_run="All",
                        field_validation=_STRICT, _request_timeout=timeout),
                    deadline=self._calls.deadline(10.0))
            except ObjectExists:
                pass
            except KubeApiError as exc:
                status = getattr(exc.__cause__, "status", None)
                if status in (400, 422):
                    raise PolicyError([f"pools.{name}.kubernetes: the cluster refuses this pool's {kind.kind} "
                                       f"(a dry-run create at startup): {exc.message}"]) from exc
                log.warning("could not check pools.%s.kubernetes against the cluster: %s", name, exc.message)

    def _informer(self, namespace: str, kind: Kind, selector: str | None) -> Informer:
        """The one shared watch of (namespace, kind, selector), started on first use."""
        key = (namespace, kind, selector)
        informer = self._informers.get(key)
        if informer is None:
            informer = self._informers[key] = Informer(self._api, self._calls, kind, namespace, selector)
            informer.start()
        return informer

    def _watch_of(self, pool: KubernetesPoolOptions, kind: Kind) -> Informer:
        """Our objects are watched by our selector; the Sandbox a claim holds carries the controller's labels."""
        ours = kind == Kind.of(pool)
        return self._informer(pool.namespace, kind, self._selector() if ours else None)

    # create ---------------------------------------------------------------
    async def ensure(self, request: SandboxRequest) -> Endpoint:
        pool = self._pool(request.pool, request.sandbox_id)
        kind = Kind.of(pool)
        deadline = self._calls.deadline(request.timeout)
        try:
            async with asyncio.timeout_at(deadline):
                obj = await self._create_or_adopt(pool, kind, request, deadline)
                return self._endpoint(pool, await self._await_ready(pool, kind, obj))
        except TimeoutError:
            await self._clean_up(request)
            raise self._timed_out(request, kind, f"; the {kind.kind} was deleted") from None
        except (Conflict, ForeignSandbox):
            raise  # not ours to delete
        except ProvisionFailed:  # terminal, deleted, or the API kept failing until the deadline
            await self._clean_up(request)
            raise

    async def _clean_up(self, request: SandboxRequest) -> None:
        """Delete what a failed ensure may have created (its create may have been stored though its answer
        was lost); a failure here is logged, never raised over the error being reported."""
        try:
            await self.delete(request.sandbox_id, request.pool)
        except ProvisionFailed as exc:
            log.warning("could not delete sandbox %s after it failed: %s; the orphan sweep will",
                        request.sandbox_id, exc.message)

    @staticmethod
    def _timed_out(request: SandboxRequest, kind: Kind, done: str) -> ProvisionTimeout:
        return ProvisionTimeout(f"sandbox {request.sandbox_id} was not Ready with a pod IP within "
                                f"{request.timeout:g}s{done}", sandbox_id=request.sandbox_id)

    async def _create_or_adopt(self, pool: KubernetesPoolOptions, kind: Kind, request: SandboxRequest,
                               deadline: float) -> Obj:
        body = self._manifest(pool, kind, request)
        name = request.sandbox_id
        existing = None
        attempts = 0
        while attempts < _CREATE_ATTEMPTS:
            try:
                return await self._calls.call(
                    "create", kind.plural, f"creating {kind.kind} {name}",
                    lambda timeout: self._api.create_namespaced_custom_object(
                        kind.group, kind.version, pool.namespace, kind.plural, body, field_validation=_STRICT,
                        _request_timeout=timeout),
                    deadline=deadline, sandbox_id=name)
            except ObjectExists:
                pass  # created before, by us on any replica (or by our own retried create) or by someone else
            existing = await self._get(pool, kind, name, deadline)
            if existing is not None and terminating(existing) and _ours(existing, self._installation):
                # Still being deleted (finalizers, garbage collection): wait for it to go, then create.
                await self._watch_of(pool, kind).wait(existing, lambda o: False)
                continue
            if existing is not None:
                break
            # Gone between our create and our read (an orphan sweep or a session's delete on another replica
            # raced us): the name is free again, so create it, rather than blame an installation that is ours.
            attempts += 1
        if existing is None or not _ours(existing, self._installation) or terminating(existing):
            raise Conflict(f"{kind.kind} {pool.namespace}/{name} already exists and is not managed "
                           f"by installation {self._installation!r}; delete it or change the installation name",
                           sandbox_id=name)
        _check_owner(request, existing)
        return existing

    async def _await_ready(self, pool: KubernetesPoolOptions, kind: Kind, obj: Obj,
                           generation: int | None = None) -> Obj:
        """The object once routable (and observed at ``generation``); a terminal reason raises."""
        name = obj["metadata"]["name"]
        found = await self._watch_of(pool, kind).wait(obj, lambda o: (
            routable(o) and observed(o, generation)) or terminal_failure(o) is not None)
        if found is None:
            raise ProvisionFailed(f"{kind.kind} {name} was deleted while starting", sandbox_id=name)
        failure = terminal_failure(found)
        if failure is not None:
            raise ProvisionFailed(f"{kind.kind} {name} failed: {failure}", sandbox_id=name)
        return found

    def _manifest(self, pool: KubernetesPoolOptions, kind: Kind, request: SandboxRequest) -> dict[str, Any]:
        owner = request.owner
        annotations = {f"{ANNOTATION}user-id": owner.user_id, f"{ANNOTATION}session-id": request.session_id}
        if owner.org_id is not None:
            annotations[f"{ANNOTATION}org-id"] = owner.org_id
        if owner.bot_id is not None:
            annotations[f"{ANNOTATION}bot-id"] = owner.bot_id
        metadata = {
            "name": request.sandbox_id,
            "labels": {MANAGED_BY: "sandbox-gateway", INSTALLATION: self._installation,
                       POOL: request.pool, ISOLATION: request.isolation.value},
            "annotations": annotations,
        }
        shutdown = None
        if pool.lifetime is not None:
            at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=pool.lifetime)
            shutdown = at.strftime("%Y-%m-%dT%H:%M:%SZ")
        spec: dict[str, Any]
        if pool.mode == "sandbox":
            spec = {"podTemplate": pool.pod_template}
            if pool.volume_claim_templates:
                spec["volumeClaimTemplates"] = pool.volume_claim_templates
            if pool.service is not None:
                spec["service"] = pool.service
            if pool.shutdown_policy is not None:
                spec["shutdownPolicy"] = pool.shutdown_policy
            if shutdown is not None:
                spec["shutdownTime"] = shutdown
        else:
            if pool.api_version == "v1beta1":
                spec = {"warmPoolRef": {"name": pool.warm_pool}}
            else:
                spec = {"sandboxTemplateRef": {"name": pool.template}}
                if pool.warm_pool:
                    spec["warmpool"] = pool.warm_pool
            if shutdown is not None or pool.shutdown_policy is not None:
                spec["lifecycle"] = {k: v for k, v in
                                     (("shutdownTime", shutdown), ("shutdownPolicy", pool.shutdown_policy)) if v}
        return {"apiVersion": f"{kind.group}/{kind.version}", "kind": kind.kind, "metadata": metadata, "spec": spec}

    def _endpoint(self, pool: KubernetesPoolOptions, obj: Mapping[str, Any]) -> Endpoint:
        return Endpoint(pod_ips(obj)[0], pool.port)

    # suspend, resume ---------------------------------------------------------
    def can_suspend(self, pool: str) -> bool:
        return True

    async def suspend(self, sandbox_id: str, pool: str) -> None:
        """Patch the Sandbox to no pod and wait (bounded) until it is no longer routable. Idempotent;
        a sandbox that is not there has nothing to suspend."""
        options = self._pool(pool, sandbox_id)
        deadline = self._calls.deadline(SUSPEND_WAIT)
        kind = sandbox_kind(options.api_version)
        try:
            async with asyncio.timeout_at(deadline):
                name = await self._sandbox_name(options, sandbox_id)
                if name is None:
                    return
                try:
                    obj = await self._set_running(options, name, sandbox_id, running=False, deadline=deadline)
                except ObjectMissing:
                    return
                await self._watch_of(options, kind).wait(obj, lambda o: not routable(o))
        except TimeoutError:
            raise ProvisionTimeout(
                f"Sandbox {options.namespace}/{sandbox_id} still had its pod {SUSPEND_WAIT:g}s after being set "
                f"{mode_patch(options.api_version, False)['spec']}; check the agent-sandbox controller",
                sandbox_id=sandbox_id) from None

    async def resume(self, request: SandboxRequest) -> Endpoint:
        """Patch the Sandbox to run and wait by watch until it is routable again (a new pod IP).
        Idempotent. An object deleted (or being deleted) while suspended is created anew (``ensure``)."""
        pool = self._pool(request.pool, request.sandbox_id)
        kind = Kind.of(pool)
        deadline = self._calls.deadline(request.timeout)
        try:
            async with asyncio.timeout_at(deadline):
                ready = await self._resume(pool, kind, request, deadline)
        except TimeoutError:
            raise ProvisionTimeout(
                f"sandbox {request.sandbox_id} was not Ready with a pod IP within {request.timeout:g}s of "
                f"resuming; it stays set to run and keeps its files", sandbox_id=request.sandbox_id) from None
        return ready if isinstance(ready, Endpoint) else self._endpoint(pool, ready)

    async def _resume(self, pool: KubernetesPoolOptions, kind: Kind, request: SandboxRequest,
                      deadline: float) -> Obj | Endpoint:
        obj = await self._get(pool, kind, request.sandbox_id, deadline)
        if obj is None or terminating(obj):
            log.warning("%s %s/%s was deleted while suspended: creating it anew (its files are gone)",
                        kind.kind, pool.namespace, request.sandbox_id)
            return await self.ensure(request)
        if not _ours(obj, self._installation):
            raise Conflict(f"{kind.kind} {pool.namespace}/{request.sandbox_id} is not managed by installation "
                           f"{self._installation!r}; it is not resumed", sandbox_id=request.sandbox_id)
        _check_owner(request, obj)
        name = _claimed_name(obj) if pool.mode == "claim" else request.sandbox_id
        target = sandbox_kind(pool.api_version)
        try:
            sandbox = await self._set_running(pool, name, request.sandbox_id, running=True, deadline=deadline)
            generation = sandbox["metadata"].get("generation")
        except ObjectMissing:
            if pool.mode == "sandbox":
                return await self._resume(pool, kind, request, deadline)  # deleted between the read and the patch
            # The claimed Sandbox is gone: the claim controller provides another; wait on the claim.
            sandbox, target, generation = obj, kind, None
        return await self._await_ready(pool, target, sandbox, generation)

    async def _sandbox_name(self, pool: KubernetesPoolOptions, sandbox_id: str) -> str | None:
        """The Sandbox behind a pool's object: itself, or the one a claim names (None: no object)."""
        if pool.mode == "sandbox":
            return sandbox_id
        claim = await self._get(pool, Kind.of(pool), sandbox_id)
        return None if claim is None else _claimed_name(claim)

    async def _set_running(self, pool: KubernetesPoolOptions, name: str, sandbox_id: str, *,
                           running: bool, deadline: float | None = None) -> Obj:
        kind = sandbox_kind(pool.api_version)
        verb = "resuming" if running else "suspending"
        return await self._calls.call(
            "patch", kind.plural, f"{verb} Sandbox {pool.namespace}/{name}",
            lambda timeout: self._api.patch_namespaced_custom_object(
                kind.group, kind.version, pool.namespace, kind.plural, name,
                mode_patch(pool.api_version, running), _content_type=MERGE_PATCH, _request_timeout=timeout),
            deadline=deadline or self._calls.deadline(), sandbox_id=sandbox_id)

    # delete, list -------------------------------------------------------
    async def delete(self, sandbox_id: str, pool: str) -> None:
        options = self._pool(pool, sandbox_id)
        kind = Kind.of(options)
        self._routable.discard(sandbox_id)
        try:
            await self._calls.call(
                "delete", kind.plural, f"deleting {kind.kind} {sandbox_id}",
                lambda timeout: self._api.delete_namespaced_custom_object(
                    kind.group, kind.version, options.namespace, kind.plural, sandbox_id,
                    body=client.V1DeleteOptions(propagation_policy="Background"), _request_timeout=timeout),
                deadline=self._calls.deadline(), sandbox_id=sandbox_id)
        except ObjectMissing:
            pass  # deleted already

    async def _list(self, namespace: str, kind: Kind, **params: Any) -> Obj:
        return await self._calls.call(
            "list", kind.plural, f"listing {kind.plural} in {namespace}",
            lambda timeout: self._api.list_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, label_selector=self._selector(),
                _request_timeout=timeout, **params),
            deadline=self._calls.deadline())

    async def list_managed(self) -> list[ManagedSandbox]:
        found: list[ManagedSandbox] = []
        for namespace, kind in self._targets():
            listing = await self._list(namespace, kind)
            found.extend(_managed(item) for item in listing.get("items", ()))
        return found

    def _targets(self) -> list[tuple[str, Kind]]:
        return sorted({(o.namespace, Kind.of(o)) for o in self._pools.values()}, key=str)

    async def managed_page(self, cursor: str | None, limit: int) -> ManagedPage:
        """One API page (``limit``/``continue``) of one (namespace, kind) at a time; the cursor is
        [target index, continue token]. An expired token (410) restarts that target's listing."""
        targets = self._targets()
        index, token = json.loads(cursor) if cursor else (0, None)
        if index >= len(targets):
            return ManagedPage([], None)
        namespace, kind = targets[index]
        try:
            listing = await self._list(namespace, kind, limit=limit, _continue=token or None)
        except WatchExpired:  # 410: the continue token expired
            if token:
                return ManagedPage([], json.dumps([index, None]))
            raise
        items = [_managed(item) for item in listing.get("items", ())]
        following = listing.get("metadata", {}).get("continue")
        if following:
            return ManagedPage(items, json.dumps([index, following]))
        return ManagedPage(items, json.dumps([index + 1, None]) if index + 1 < len(targets) else None)

    async def probe(self, sandbox_id: str, pool: str) -> Probe:
        """GONE when the object is not there (deleted behind our back) or is being deleted, ALIVE when
        it is routable."""
        options = self._pools.get(pool)
        if options is None:
            return Probe.UNKNOWN
        try:
            obj = await self._get(options, Kind.of(options), sandbox_id)
        except KubeApiError:
            return Probe.UNKNOWN  # the API server did not answer: never re-create on a guess
        if obj is None or terminating(obj):
            return Probe.GONE
        return Probe.ALIVE if routable(obj) else Probe.UNKNOWN

    # lost sandboxes -------------------------------------------------------
    def _on_managed(self, event: str, obj: Obj) -> None:
        """Report objects of ours that are deleted or stop being routable (the shared watch's listener)."""
        name = obj["metadata"]["name"]
        if event != "DELETED" and suspended_spec(obj) and not terminating(obj):
            self._routable.discard(name)  # suspended on purpose: not lost
        elif event == "DELETED" or not routable(obj):
            if name in self._routable:
                self._routable.discard(name)
                if self._on_lost is not None:
                    self._on_lost(name)
        else:
            self._routable.add(name)

    # helpers ----------------------------------------------------------------
    def _selector(self) -> str:
        return f"{MANAGED_BY}=sandbox-gateway,{INSTALLATION}={self._installation}"

    def _pool(self, pool: str, sandbox_id: str) -> KubernetesPoolOptions:
        options = self._pools.get(pool)
        if options is None:
            raise ProvisionFailed(f"pool {pool!r} is not a kubernetes pool", sandbox_id=sandbox_id)
        return options

    async def _get(self, pool: KubernetesPoolOptions, kind: Kind, name: str,
                   deadline: float | None = None) -> Obj | None:
        """The object, or None when there is none of that name."""
        try:
            return await self._calls.call(
                "get", kind.plural, f"reading {kind.kind} {pool.namespace}/{name}",
                lambda timeout: self._api.get_namespaced_custom_object(
                    kind.group, kind.version, pool.namespace, kind.plural, name, _request_timeout=timeout),
                deadline=deadline or self._calls.deadline(), sandbox_id=name)
        except ObjectMissing:
            return None

    def describe(self) -> str:
        return ", ".join(f"{name}: {o.mode} {o.api_version} in {o.namespace}" for name, o in self._pools.items())


def _managed(item: Mapping[str, Any]) -> ManagedSandbox:
    meta = item["metadata"]
    created = meta.get("creationTimestamp")
    at = dt.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() if created else time.time()
    return ManagedSandbox(meta["name"], (meta.get("labels") or {}).get(POOL, ""), at)


def _ours(obj: Mapping[str, Any], installation: str) -> bool:
    """Labelled as this installation's (exactly what its watch selects, so a wait on it is seen)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(INSTALLATION) == installation and labels.get(MANAGED_BY) == "sandbox-gateway"


def _claimed_name(claim: Mapping[str, Any]) -> str:
    """The Sandbox a claim holds: ``status.sandbox.name`` (a warm-pool Sandbox has its own name),
    else the claim's name (a Sandbox made for the claim is named like it)."""
    return ((claim.get("status") or {}).get("sandbox") or {}).get("name") or claim["metadata"]["name"]


def _check_owner(request: SandboxRequest, obj: Mapping[str, Any]) -> None:
    """Refuse to adopt an object whose owner annotations name another identity.

    Every version wrote ``user-id`` (and ``org-id``/``bot-id`` when set); an object without it
    is claimed only on evidence (``SandboxRequest.may_claim``, with its creation time rounded up:
    ``creationTimestamp`` has whole seconds).
    """
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    user_id = annotations.get(f"{ANNOTATION}user-id")
    owner = None if user_id is None else Owner(annotations.get(f"{ANNOTATION}org-id"), user_id,
                                               annotations.get(f"{ANNOTATION}bot-id"))
    created = meta.get("creationTimestamp")
    made_at = dt.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() + 1.0 if created else 0.0
    if not request.may_claim(owner, made_at):
        raise ForeignSandbox(request.sandbox_id)

