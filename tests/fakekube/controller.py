"""A simulated agent-sandbox controller (sandbox, warm-pool and claim reconcilers) inside the test
process. It subscribes to the store's change events (no polling), queues object keys, and
reconciles them one at a time through the same request pipeline as HTTP clients (so its writes
are schema-validated and produce watch events). Delays are timers (`loop.call_later`), never sleeps.

Sandbox: Ready=False/DependenciesNotReady, then after `ready_delay` Ready=True/DependenciesReady
with podIPs=[the pod's IP], service, serviceFQDN, selector (+ replicas at v1alpha1 storage,
nodeName at v1beta1). The first pod of a Sandbox gets `pod_ip_for(ns, name)`; every later pod of
the same Sandbox (after a suspend, `lose_pod` + `recover`, a failure) gets the next address after
its predecessor's, as a pod IP changes in a cluster (127.0.0.1, then 127.0.0.2, ...: all loopback).
Suspend (`spec.operatingMode: Suspended` at v1beta1, `spec.replicas: 0` at v1alpha1): the pod is
deleted, Ready=False SandboxSuspended, no podIPs, or, with `ready_when_suspended` (old
controllers, default for v0.4.6), Ready=True with no podIPs. Resume (`Running` / `replicas: 1`):
a new pod, Ready=False while it is pending, then Ready=True with the new pod's IP.
shutdownTime reached: Ready=False SandboxExpired, deleted if shutdownPolicy is Delete. A
simulated core/v1 Pod (name = sandbox name) follows the sandbox.

SandboxWarmPool: keeps spec.replicas Sandboxes (generateName "<pool>-") owned by the pool.
SandboxClaim: adopts a pool sandbox (re-owned by the claim) or creates a Sandbox named like the
claim from the template; reasons TemplateNotFound, WarmPoolNotFound, EnvVarsInjectionRejected,
ClaimExpired, SandboxMissing, SandboxNotReady; otherwise mirrors the sandbox's Ready condition.
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .api import rfc3339
from .convert import SHADOW_POOL_PREFIX
from .crds import PODS
from .errors import ApiError
from .store import Event

log = logging.getLogger(__name__)
Obj = dict[str, Any]
Key = tuple[str, str, str]  # (plural, namespace, name)

SANDBOX_GROUP, EXT_GROUP = "agents.x-k8s.io", "extensions.agents.x-k8s.io"
NAME_HASH_LABEL = "agents.x-k8s.io/sandbox-name-hash"
WARM_POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox"
TEMPLATE_REF_HASH_LABEL = "agents.x-k8s.io/sandbox-template-ref-hash"
LAUNCH_TYPE_LABEL = "agents.x-k8s.io/launch-type"
TEMPLATE_REF_ANNOTATION = "agents.x-k8s.io/sandbox-template-ref"
TERMINAL_POD_REASONS = ("PodFailed", "PodSucceeded")
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # metav1.Condition reason, as in the CRDs


def name_hash(name: str) -> str:
    """FNV-1a 32-bit, hex (the label values; not byte-identical to upstream's NameHash)."""
    h = 0x811C9DC5
    for byte in name.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


def parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def controller_of(obj: Obj) -> Obj | None:
    return next((r for r in obj["metadata"].get("ownerReferences") or () if r.get("controller")), None)


def ready_condition(obj: Obj | None) -> Obj | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or () if c["type"] == "Ready"), None)


@dataclass
class PodState:
    ready: bool = False
    ip: str | None = None
    lost: bool = False
    failed: tuple[str, str] | None = None
    incarnation: int = 0  # how many pods this Sandbox had before this one


class FakeController:
    def __init__(self, server: Any, *, ready_delay: float = 0.05,
                 pod_ip_for: Callable[[str, str], str] | None = None, ready_when_suspended: bool | None = None,
                 cluster_domain: str = "cluster.local", node_name: str = "fake-node"):
        self.server, self.api = server, server.api
        self.ready_delay = ready_delay
        self.pod_ip_for = pod_ip_for or (lambda namespace, name: "127.0.0.1")
        self.ready_when_suspended = server.crd_set == "v0.4.6" if ready_when_suspended is None else ready_when_suspended
        self.cluster_domain, self.node_name = cluster_domain, node_name
        self.errors: list[BaseException] = []
        self._res = {p: server.crds.by_plural(p) for p in ("sandboxes", "sandboxclaims", "sandboxwarmpools",
                                                             "sandboxtemplates")}
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._pods: dict[str, PodState] = {}  # by sandbox uid
        self._pods_started: dict[str, int] = {}  # by sandbox uid: pods created so far (the next incarnation)
        self._timers: dict[Any, asyncio.TimerHandle] = {}
        self._held: list[tuple[str, Key]] = []
        self._paused = False
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    # --- lifecycle and hooks ----------------------------------------------------------------

    async def start(self) -> None:
        self._unsubscribe = self.api.store.subscribe(self._on_event)
        for plural in ("sandboxes", "sandboxwarmpools", "sandboxclaims"):
            for obj in self.api.store.items(self._res[plural].key):
                self._enqueue((plural, obj["metadata"]["namespace"], obj["metadata"]["name"]))
        self._task = asyncio.create_task(self._run(), name="fakekube-controller")

    async def stop(self) -> None:
        if self._unsubscribe:
            self._unsubscribe()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def pause(self) -> None:
        """Hold readiness: sandboxes whose pod would become ready wait until `resume()`."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        held, self._held = self._held, []
        for uid, key in held:
            self._mark_ready(uid, key)

    def fail(self, name: str, namespace: str = "default", reason: str = "PodFailed",
             message: str = "simulated pod failure") -> None:
        """A terminal Ready=False condition with `reason` (plus Finished=True for PodFailed/PodSucceeded)."""
        if not _REASON.match(reason):
            raise ValueError(f"condition reasons must match {_REASON.pattern}: {reason!r}")
        self._state_of(name, namespace).failed = (reason, message)
        self._enqueue(("sandboxes", namespace, name))

    def lose_pod(self, name: str, namespace: str = "default") -> None:
        """The pod disappears: podIPs cleared, Ready=False (DependenciesNotReady) until `recover()`."""
        state = self._state_of(name, namespace)
        state.lost, state.ready, state.ip = True, False, None
        self._enqueue(("sandboxes", namespace, name))

    def recover(self, name: str, namespace: str = "default") -> None:
        """Undo `fail`/`lose_pod`: a new pod starts and becomes ready after `ready_delay`."""
        sandbox = self._get("sandboxes", namespace, name)
        if sandbox is not None:
            self._pods.pop(sandbox["metadata"]["uid"], None)
            self._enqueue(("sandboxes", namespace, name))

    def _state_of(self, name: str, namespace: str) -> PodState:
        sandbox = self._get("sandboxes", namespace, name)
        if sandbox is None:
            raise KeyError(f"no Sandbox {namespace}/{name}")
        return self._pods.setdefault(sandbox["metadata"]["uid"], PodState())

    # --- queue ------------------------------------------------------------------------------

    def _enqueue(self, key: Key) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def _on_event(self, event: Event) -> None:
        plural, ns, name = event.resource.split(".", 1)[0], event.namespace, event.name
        if plural == "sandboxes":
            self._enqueue(("sandboxes", ns, name))
            self._enqueue(("sandboxclaims", ns, name))
            for obj in (event.obj, event.prev):
                for ref in (obj or {}).get("metadata", {}).get("ownerReferences") or ():
                    kind = {"SandboxClaim": "sandboxclaims", "SandboxWarmPool": "sandboxwarmpools"}.get(ref["kind"])
                    if kind:
                        self._enqueue((kind, ns, ref["name"]))
        elif plural in ("sandboxclaims", "sandboxwarmpools"):
            self._enqueue((plural, ns, name))
        if plural in ("sandboxwarmpools", "sandboxtemplates") or (plural == "sandboxes" and event.type != "MODIFIED"):
            for dependent in ("sandboxwarmpools", "sandboxclaims"):
                for obj in self.api.store.items(self._res[dependent].key, ns):
                    self._enqueue((dependent, ns, obj["metadata"]["name"]))

    async def _run(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            try:
                {"sandboxes": self._reconcile_sandbox, "sandboxwarmpools": self._reconcile_pool,
                 "sandboxclaims": self._reconcile_claim}[key[0]](key[1], key[2])
            except Exception as exc:  # surfaced through .errors; the fixture fails the test on it
                log.exception("fakekube controller: reconciling %s failed", key)
                self.errors.append(exc)

    def _timer(self, tag: Any, delay: float, callback: Callable[[], None]) -> None:
        if tag in self._timers:
            self._timers.pop(tag).cancel()
        self._timers[tag] = asyncio.get_running_loop().call_later(max(delay, 0.0), self._fire, tag, callback)

    def _fire(self, tag: Any, callback: Callable[[], None]) -> None:
        self._timers.pop(tag, None)
        callback()

    def _wake_at(self, key: Key, when: datetime) -> None:
        self._timer(("at", key), (when - self.api.clock()).total_seconds(), lambda: self._enqueue(key))

    # --- store helpers ----------------------------------------------------------------------

    def _get(self, plural: str, namespace: str, name: str) -> Obj | None:
        return self.api.store.get(self._res[plural].key, namespace, name)

    def _items(self, plural: str, namespace: str) -> list[Obj]:
        return self.api.store.items(self._res[plural].key, namespace)

    def _version(self, plural: str) -> str:
        return self._res[plural].storage_version

    def _write_status(self, plural: str, obj: Obj, status: Obj) -> None:
        status = {k: v for k, v in status.items() if v not in (None, [], {}, "")}
        if status == (obj.get("status") or {}):
            return
        body = {**obj, "status": status}
        self.api.replace(self._res[plural], self._version(plural), obj["metadata"]["namespace"],
                         obj["metadata"]["name"], body, subresource="status", actor="controller")

    def _set_condition(self, obj: Obj, ctype: str, status: str, reason: str, message: str,
                       generation: int | None = None) -> list[Obj]:
        conditions = [c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] != ctype]
        old = next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == ctype), None)
        changed = old is None or old["status"] != status
        conditions.append({
            "type": ctype, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": rfc3339(self.api.clock()) if changed else old["lastTransitionTime"],
            "observedGeneration": generation if generation is not None else obj["metadata"].get("generation", 1),
        })
        return sorted(conditions, key=lambda c: c["type"])

    def _owner_ref(self, plural: str, obj: Obj) -> Obj:
        res = self._res[plural]
        return {"apiVersion": res.api_version(res.storage_version), "kind": res.kind,
                "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
                "controller": True, "blockOwnerDeletion": True}

    # --- Sandbox ----------------------------------------------------------------------------

    def _reconcile_sandbox(self, ns: str, name: str) -> None:
        sandbox = self._get("sandboxes", ns, name)
        if sandbox is None or sandbox["metadata"].get("deletionTimestamp"):
            return
        uid, spec = sandbox["metadata"]["uid"], sandbox["spec"]
        key = ("sandboxes", ns, name)
        shutdown = parse_time(spec.get("shutdownTime"))
        alpha = self._version("sandboxes") == "v1alpha1"
        status: Obj = {"selector": f"{NAME_HASH_LABEL}={name_hash(name)}"}
        # v0.4.6 controllers always made a headless Service; newer ones only when spec.service is true
        old_controller = self.server.crd_set == "v0.4.6"
        wants_service = spec.get("service") is not False if old_controller else spec.get("service") is True
        if wants_service:
            status.update(service=name, serviceFQDN=f"{name}.{ns}.svc.{self.cluster_domain}")
        if shutdown and shutdown <= self.api.clock():
            self._drop_pod(uid, ns, name)
            status = {"conditions": self._set_condition(sandbox, "Ready", "False", "SandboxExpired",
                                                        "Sandbox has expired"), "replicas": 0 if alpha else None}
            self._write_status("sandboxes", sandbox, status)
            if spec.get("shutdownPolicy") == "Delete":
                self.api.delete(self._res["sandboxes"], self._version("sandboxes"), ns, name)
            return
        if shutdown:
            self._wake_at(key, shutdown)
        state = self._pods.get(uid)
        suspended = spec.get("replicas") == 0 or spec.get("operatingMode") == "Suspended"
        if state is not None and state.failed:
            reason, message = state.failed
            self._pod_status(uid, ns, name, "Failed" if reason != "PodSucceeded" else "Succeeded")
            conditions = self._set_condition(sandbox, "Ready", "False", reason, message)
            if reason in TERMINAL_POD_REASONS and not alpha:
                conditions = self._set_condition({**sandbox, "status": {"conditions": conditions}}, "Finished",
                                                 "True", reason, message)
            status.update(conditions=conditions, replicas=0 if alpha else None)
        elif suspended:
            self._drop_pod(uid, ns, name)
            if self.ready_when_suspended:
                conditions = self._set_condition(sandbox, "Ready", "True", "DependenciesReady", "Sandbox is suspended")
            else:
                conditions = self._set_condition(sandbox, "Ready", "False", "SandboxSuspended", "Sandbox is suspended")
            status.update(conditions=conditions, replicas=0 if alpha else None)
        else:
            if state is None:
                incarnation = self._pods_started.get(uid, 0)
                self._pods_started[uid] = incarnation + 1
                state = self._pods[uid] = PodState(incarnation=incarnation)
                self._create_pod(sandbox)
                self._timer(("ready", uid), self.ready_delay, lambda: self._mark_ready(uid, key))
            if state.lost:
                self._drop_pod(uid, ns, name, forget=False)
                ready = ("False", "DependenciesNotReady", "Pod does not exist")
            elif state.ready:
                ready = ("True", "DependenciesReady", "Pod is Ready" + ("; Service Exists" if wants_service else ""))
                status.update(podIPs=[state.ip], nodeName=None if alpha else self.node_name)
            else:
                ready = ("False", "DependenciesNotReady", "Pod exists with phase: Pending")
            status.update(conditions=self._set_condition(sandbox, "Ready", *ready), replicas=1 if alpha else None)
        self._write_status("sandboxes", sandbox, status)

    def _mark_ready(self, uid: str, key: Key) -> None:
        state = self._pods.get(uid)
        if state is None or state.lost or state.failed:
            return
        if self._paused:
            self._held.append((uid, key))
            return
        state.ready, state.ip = True, self._pod_ip(key[1], key[2], state.incarnation)
        self._pod_status(uid, key[1], key[2], "Running", state.ip)
        self._enqueue(key)

    def _pod_ip(self, namespace: str, name: str, incarnation: int) -> str:
        """The first pod's IP is `pod_ip_for`'s; each later pod of the Sandbox gets the next address."""
        return str(ipaddress.ip_address(self.pod_ip_for(namespace, name)) + incarnation)

    def _create_pod(self, sandbox: Obj) -> None:
        meta = sandbox["metadata"]
        if self.api.store.get(PODS.key, meta["namespace"], meta["name"]) is not None:
            return
        template = sandbox["spec"].get("podTemplate") or {}
        labels = {**(template.get("metadata") or {}).get("labels", {}), NAME_HASH_LABEL: name_hash(meta["name"])}
        body = {"apiVersion": "v1", "kind": "Pod", "spec": copy.deepcopy(template.get("spec") or {}),
                "metadata": {"name": meta["name"], "labels": labels,
                             "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                             "ownerReferences": [self._owner_ref("sandboxes", sandbox)]}}
        self.api.create(PODS, "v1", meta["namespace"], body, actor="controller")
        self._pod_status(meta["uid"], meta["namespace"], meta["name"], "Pending")

    def _pod_status(self, uid: str, ns: str, name: str, phase: str, ip: str | None = None) -> None:
        pod = self.api.store.get(PODS.key, ns, name)
        if pod is None or (controller_of(pod) or {}).get("uid") != uid:
            return
        status: Obj = {"phase": phase}
        if ip:
            status.update(podIP=ip, podIPs=[{"ip": ip}], hostIP="10.0.0.1",
                          conditions=[{"type": "Ready", "status": "True"}])
        self.api.replace(PODS, "v1", ns, name, {**pod, "status": status}, subresource="status", actor="controller")

    def _drop_pod(self, uid: str, ns: str, name: str, forget: bool = True) -> None:
        if forget:
            self._pods.pop(uid, None)
        pod = self.api.store.get(PODS.key, ns, name)
        if pod is not None and (controller_of(pod) or {}).get("uid") == uid:
            self.api.delete(PODS, "v1", ns, name)

    # --- SandboxWarmPool --------------------------------------------------------------------

    def _sandbox_body(self, template: Obj, ns: str, owner: tuple[str, Obj], labels: dict[str, str], *,
                      name: str | None = None, generate_name: str | None = None,
                      pod_metadata: Obj | None = None, env: list[Obj] | None = None) -> Obj:
        tspec = template["spec"]
        pod_template = copy.deepcopy(tspec["podTemplate"])
        pod_template["spec"].setdefault("automountServiceAccountToken", False)
        for field in ("labels", "annotations"):
            extra = (pod_metadata or {}).get(field)
            if extra:
                pod_template.setdefault("metadata", {}).setdefault(field, {}).update(extra)
        for var in env or ():
            for container in pod_template["spec"].get("containers") or ():
                if var.get("containerName") in (None, container["name"]):
                    envs = [e for e in container.get("env") or () if e["name"] != var["name"]]
                    container["env"] = envs + [{"name": var["name"], "value": var["value"]}]
        spec: Obj = {"podTemplate": pod_template}
        for field in ("service", "volumeClaimTemplates"):
            if field in tspec:
                spec[field] = copy.deepcopy(tspec[field])
        res = self._res["sandboxes"]
        meta: Obj = {"labels": labels, "annotations": {TEMPLATE_REF_ANNOTATION: template["metadata"]["name"]},
                     "ownerReferences": [self._owner_ref(*owner)]}
        meta.update({"name": name} if name else {"generateName": generate_name})
        return {"apiVersion": res.api_version(res.storage_version), "kind": "Sandbox", "metadata": meta,
                "spec": spec}

    def _reconcile_pool(self, ns: str, name: str) -> None:
        pool = self._get("sandboxwarmpools", ns, name)
        if pool is None or pool["metadata"].get("deletionTimestamp"):
            return
        uid, spec = pool["metadata"]["uid"], pool["spec"]
        desired = spec.get("replicas", 1)
        template_name = spec["sandboxTemplateRef"]["name"]
        owned = [s for s in self._items("sandboxes", ns)
                 if (controller_of(s) or {}).get("uid") == uid and not s["metadata"].get("deletionTimestamp")]
        template = self._get("sandboxtemplates", ns, template_name)
        labels = {WARM_POOL_LABEL: name_hash(name), TEMPLATE_REF_HASH_LABEL: name_hash(template_name),
                  LAUNCH_TYPE_LABEL: "warm"}
        while template is not None and len(owned) < desired:
            body = self._sandbox_body(template, ns, ("sandboxwarmpools", pool), labels, generate_name=f"{name}-")
            owned.append(self.api.create(self._res["sandboxes"], self._version("sandboxes"), ns, body,
                                         actor="controller").obj)
        for extra in sorted(owned, key=lambda s: s["metadata"]["creationTimestamp"])[desired:]:
            self.api.delete(self._res["sandboxes"], self._version("sandboxes"), ns, extra["metadata"]["name"])
        owned = owned[:desired] if len(owned) > desired else owned
        ready = sum(1 for s in owned if (ready_condition(s) or {}).get("status") == "True")
        status = {"replicas": len(owned), "readyReplicas": ready, "selector": f"{WARM_POOL_LABEL}={name_hash(name)}"}
        if self._version("sandboxwarmpools") != "v1alpha1":
            status["observedGeneration"] = pool["metadata"].get("generation", 1)
        self._write_status("sandboxwarmpools", pool, status)

    # --- SandboxClaim -----------------------------------------------------------------------

    def _reconcile_claim(self, ns: str, name: str) -> None:
        claim = self._get("sandboxclaims", ns, name)
        if claim is None or claim["metadata"].get("deletionTimestamp"):
            return
        lifecycle = claim["spec"].get("lifecycle") or {}
        shutdown = parse_time(lifecycle.get("shutdownTime"))
        if shutdown and shutdown > self.api.clock():
            self._wake_at(("sandboxclaims", ns, name), shutdown)
        elif shutdown:
            policy = lifecycle.get("shutdownPolicy", "Retain")
            if policy in ("Delete", "DeleteForeground"):
                self.api.delete(self._res["sandboxclaims"], self._version("sandboxclaims"), ns, name,
                                {"propagationPolicy": "Foreground" if policy == "DeleteForeground" else "Background"})
                return
            bound = self._get("sandboxes", ns, ((claim.get("status") or {}).get("sandbox") or {}).get("name") or name)
            if bound is not None and (controller_of(bound) or {}).get("uid") == claim["metadata"]["uid"]:
                self.api.delete(self._res["sandboxes"], self._version("sandboxes"), ns, bound["metadata"]["name"])
            conditions = self._set_condition(claim, "Ready", "False", "ClaimExpired",
                                             "Claim expired. Sandbox cleanup initiated.")
            self._write_status("sandboxclaims", claim, {"conditions": conditions})
            return
        sandbox, problem = self._claim_sandbox(claim)
        if problem:
            ready = ("False", *problem)
        elif sandbox is None:
            ready = ("False", "SandboxMissing", "Sandbox does not exist")
        else:
            cond = ready_condition(sandbox)
            if cond and cond["reason"] == "SandboxExpired":
                ready = ("False", "SandboxExpired",
                         "Underlying Sandbox resource has expired independently of the Claim.")
            elif cond:
                ready = (cond["status"], cond["reason"], cond["message"])
            else:
                ready = ("False", "SandboxNotReady", "Sandbox is not ready")
        bound_status: Obj = {}
        if sandbox is not None:
            bound_status = {"name": sandbox["metadata"]["name"]}
            if (sandbox.get("status") or {}).get("podIPs"):
                bound_status["podIPs"] = sandbox["status"]["podIPs"]
        self._write_status("sandboxclaims", claim, {"conditions": self._set_condition(claim, "Ready", *ready),
                                                    "sandbox": bound_status})

    def _claim_sandbox(self, claim: Obj) -> tuple[Obj | None, tuple[str, str] | None]:
        ns, name, uid = claim["metadata"]["namespace"], claim["metadata"]["name"], claim["metadata"]["uid"]
        spec = claim["spec"]
        bound_name = ((claim.get("status") or {}).get("sandbox") or {}).get("name")
        for candidate in filter(None, (bound_name, name)):
            sandbox = self._get("sandboxes", ns, candidate)
            if sandbox is not None and (controller_of(sandbox) or {}).get("uid") == uid:
                return sandbox, None
        if self._get("sandboxes", ns, name) is not None:
            return None, ("ReconcilerError", f'Error seen: sandbox "{name}" exists and is not controlled by this claim')
        if "warmPoolRef" in spec:  # v1beta1 storage
            pool_name = spec["warmPoolRef"]["name"]
            pool = self._get("sandboxwarmpools", ns, pool_name)
            if pool is not None:
                template_name, pools = pool["spec"]["sandboxTemplateRef"]["name"], [pool]
            elif pool_name.startswith(SHADOW_POOL_PREFIX):
                template_name, pools = pool_name[len(SHADOW_POOL_PREFIX):], []
            else:
                return None, ("WarmPoolNotFound", f'SandboxWarmPool "{pool_name}" not found')
        else:  # v1alpha1 storage: template + warmpool policy
            template_name, policy = spec["sandboxTemplateRef"]["name"], spec.get("warmpool", "default")
            if policy == "none":
                pools = []
            elif policy == "default":
                pools = [p for p in self._items("sandboxwarmpools", ns)
                         if p["spec"]["sandboxTemplateRef"]["name"] == template_name]
            else:
                pool = self._get("sandboxwarmpools", ns, policy)
                if pool is None:
                    return None, ("WarmPoolNotFound", f'SandboxWarmPool "{policy}" not found')
                pools = [pool]
        pool_uids = {p["metadata"]["uid"] for p in pools}
        candidates = [s for s in self._items("sandboxes", ns) if (controller_of(s) or {}).get("uid") in pool_uids
                      and not s["metadata"].get("deletionTimestamp")
                      and (ready_condition(s) or {}).get("reason") not in ("SandboxExpired", *TERMINAL_POD_REASONS)]
        if candidates:
            candidates.sort(key=lambda s: ((ready_condition(s) or {}).get("status") != "True",
                                           s["metadata"]["creationTimestamp"], s["metadata"]["name"]))
            return self._adopt(candidates[0], claim), None
        template = self._get("sandboxtemplates", ns, template_name)
        if template is None:
            return None, ("TemplateNotFound", f'SandboxTemplate "{template_name}" not found')
        if spec.get("env") and template["spec"].get("envVarsInjectionPolicy", "Disallowed") == "Disallowed":
            return None, ("EnvVarsInjectionRejected", "environment variable injection rejected: the template's "
                                                      "envVarsInjectionPolicy is Disallowed")
        labels = {TEMPLATE_REF_HASH_LABEL: name_hash(template_name), LAUNCH_TYPE_LABEL: "cold"}
        body = self._sandbox_body(template, ns, ("sandboxclaims", claim), labels, name=name,
                                  pod_metadata=spec.get("additionalPodMetadata"), env=spec.get("env"))
        try:
            created = self.api.create(self._res["sandboxes"], self._version("sandboxes"), ns, body, actor="controller")
        except ApiError as err:
            return None, ("ReconcilerError", f"Error seen: {err}")
        return created.obj, None

    def _adopt(self, sandbox: Obj, claim: Obj) -> Obj:
        adopted = copy.deepcopy(sandbox)
        meta = adopted["metadata"]
        meta["ownerReferences"] = [self._owner_ref("sandboxclaims", claim)]
        meta.get("labels", {}).pop(WARM_POOL_LABEL, None)
        extra = claim["spec"].get("additionalPodMetadata") or {}
        for field in ("labels", "annotations"):
            if extra.get(field):
                adopted["spec"]["podTemplate"].setdefault("metadata", {}).setdefault(field, {}).update(extra[field])
        return self.api.replace(self._res["sandboxes"], self._version("sandboxes"), meta["namespace"], meta["name"],
                                adopted, actor="controller").obj
