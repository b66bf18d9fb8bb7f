"""The agent-sandbox API as this gateway speaks it: labels and annotations, the resource kinds,
``ApiException`` mapped to typed errors in one place, the readiness rules read from an object's
status, watch events, and the API client.

Shared by :class:`~gateway.providers.kubernetes.KubernetesProvider` (which creates, watches,
suspends and deletes) and the router-compat locator (which only reads a Sandbox's pod IP), so
neither imports the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from gateway.errors import KubeApiError
from gateway.providers.kubernetes_options import KubernetesPoolOptions

MANAGED_BY = "app.kubernetes.io/managed-by"
INSTALLATION = "sandbox-gateway.io/installation"
POOL = "sandbox-gateway.io/pool"
ISOLATION = "sandbox-gateway.io/isolation"
ANNOTATION = "sandbox-gateway.io/"

TERMINAL_REASONS = frozenset({
    "SandboxExpired", "ClaimExpired", "TemplateNotFound", "WarmPoolNotFound", "ReconcilerError",
    "PodFailed", "PodSucceeded", "InvalidMetadata", "EnvVarsInjectionRejected",
})

# Exactly what this provider calls, per pool mode; the Helm chart's Role in each pool namespace renders
# rbac_rules(the modes of the pools there). A claim pool patches (suspend, resume) and watches the Sandbox
# its claim holds, but never creates or deletes one: creating a Sandbox amounts to creating any pod.
RBAC_RULES_BY_MODE: dict[str, tuple[dict[str, Any], ...]] = {
    # patch: suspend and resume (spec.operatingMode, or spec.replicas at v1alpha1)
    "sandbox": ({"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"],
                 "verbs": ["get", "list", "watch", "create", "delete", "patch"]},),
    "claim": ({"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["list", "watch", "patch"]},
              {"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["sandboxclaims"],
               "verbs": ["get", "list", "watch", "create", "delete"]}),
}


def rbac_rules(modes: Any) -> tuple[dict[str, Any], ...]:
    """The rules a namespace whose pools have these modes needs: the union, one rule per resource."""
    verbs: dict[tuple[str, str], set[str]] = {}
    for mode in modes:
        for rule in RBAC_RULES_BY_MODE[mode]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return tuple({"apiGroups": [g], "resources": [r], "verbs": sorted(v)} for (g, r), v in sorted(verbs.items()))


#: Every mode's rules at once (an rbac.extraNamespaces namespace, whose pools' modes the chart cannot see).
RBAC_RULES = rbac_rules(RBAC_RULES_BY_MODE)

@dataclass(frozen=True, slots=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str

    @classmethod
    def of(cls, pool: KubernetesPoolOptions) -> Kind:
        if pool.mode == "claim":
            return cls("extensions.agents.x-k8s.io", pool.api_version, "sandboxclaims", "SandboxClaim")
        return cls("agents.x-k8s.io", pool.api_version, "sandboxes", "Sandbox")


def sandbox_kind(api_version: str) -> Kind:
    """The ``Sandbox`` resource (agents.x-k8s.io) at one API version."""
    return Kind("agents.x-k8s.io", api_version, "sandboxes", "Sandbox")


MERGE_PATCH = "application/merge-patch+json"
# How long suspend waits for the controller to take the pod away (the spec is patched at once).
SUSPEND_WAIT = 120.0


class ObjectMissing(KubeApiError):
    """404: no object of that name (a delete treats it as done, a read as None)."""


class ObjectExists(KubeApiError):
    """409: an object of that name exists already (a create adopts it)."""


class WatchExpired(KubeApiError):
    """410 Gone: the resourceVersion fell out of the watch cache; read afresh and watch again."""


# The provider's control flow, not errors a client sees (``KubeApiError``, 503, were one to escape).
_BY_STATUS: dict[int, type[KubeApiError]] = {404: ObjectMissing, 409: ObjectExists, 410: WatchExpired}


@contextlib.contextmanager
def translated(doing: str, sandbox_id: str | None = None) -> Iterator[None]:
    """Every ``ApiException`` raised inside becomes a ``KubeApiError`` (by status, never by message)
    saying what we were ``doing``, raised from it."""
    try:
        yield
    except ApiException as exc:
        error = _BY_STATUS.get(exc.status or 0, KubeApiError)
        detail = _status_message(exc) if exc.status in (400, 403, 422) else None
        raise error(f"Kubernetes API error {exc.status} {exc.reason} while {doing}"
                    + (f": {detail}" if detail else ""), sandbox_id=sandbox_id) from exc


def _status_message(exc: ApiException) -> str | None:
    """The apiserver's own words (a Status ``message``): what a 400 (strict field validation names
    the unknown field), 403 or 422 is about."""
    try:
        body = json.loads(exc.body) if exc.body else None
    except (TypeError, ValueError):
        return None
    message = body.get("message") if isinstance(body, dict) else None
    return str(message)[:500] if message else None


async def read_object(api: client.CustomObjectsApi, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
    """The object, or None when there is none of that name."""
    try:
        with translated(f"reading {kind.kind} {namespace}/{name}", name):
            return await api.get_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, name)
    except ObjectMissing:
        return None


def ready_condition(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return condition
    return None


def pod_ips(obj: Mapping[str, Any]) -> list[str]:
    status = obj.get("status") or {}
    if obj.get("kind") == "SandboxClaim":
        return list((status.get("sandbox") or {}).get("podIPs") or ())
    return list(status.get("podIPs") or ())


def terminating(obj: Mapping[str, Any]) -> bool:
    """Deletion has begun (finalizers or garbage collection still hold the object): never adopted,
    never routed to; it is waited out."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def routable(obj: Mapping[str, Any]) -> bool:
    if terminating(obj):
        return False
    ready = ready_condition(obj)
    return ready is not None and ready.get("status") == "True" and bool(pod_ips(obj))


def routable_pod_ip(obj: Mapping[str, Any]) -> str | None:
    """The address to route to: the first pod IP of a routable object, else None."""
    return pod_ips(obj)[0] if routable(obj) else None


def suspended_spec(obj: Mapping[str, Any]) -> bool:
    """Whether a Sandbox's spec asks for no pod (v1beta1 ``operatingMode``, v1alpha1 ``replicas``)."""
    spec = obj.get("spec") or {}
    return spec.get("operatingMode") == "Suspended" or spec.get("replicas") == 0


def mode_patch(api_version: str, running: bool) -> dict[str, Any]:
    if api_version == "v1alpha1":
        return {"spec": {"replicas": 1 if running else 0}}
    return {"spec": {"operatingMode": "Running" if running else "Suspended"}}


def observed(obj: Mapping[str, Any], generation: int | None) -> bool:
    """The Ready condition reflects ``generation`` of the spec (or says nothing either way)."""
    seen = (ready_condition(obj) or {}).get("observedGeneration")
    return generation is None or seen is None or seen >= generation


def terminal_failure(obj: Mapping[str, Any]) -> str | None:
    """The reason an object will not become ready, else None. A claim's ReconcilerError is not one:
    the claim controller requeues it (above all while the garbage collector still removes the
    Sandbox of a claim of the same name that was deleted)."""
    ready = ready_condition(obj)
    if ready is not None and obj.get("kind") == "SandboxClaim" and ready.get("reason") == "ReconcilerError":
        return None
    if ready is not None and ready.get("status") == "False" and ready.get("reason") in TERMINAL_REASONS:
        return f"{ready['reason']}: {ready.get('message') or 'no message'}"
    return None


async def watch_events(api: client.CustomObjectsApi, kind: Kind, namespace: str, *, observer: Any = None,
                       **params: Any) -> AsyncIterator[dict[str, Any]]:
    """Watch events as dicts, through the real client's list call with ``watch=True``.

    Not ``kubernetes_asyncio.watch.Watch``: each of those builds its own ApiClient
    and SSL context (~50 ms of CPU on the event loop), once per sandbox here.
    A non-200 answer (a 429, 5xx or 403 instead of a stream: the client does not check it for a
    streamed call) and an ERROR event (410 Gone above all) are raised as the ``ApiException``
    they mean, with the answer's headers (``Retry-After``). ``observer`` (a ``KubeObserver``)
    is told the answer's status.
    """
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        response = await api.list_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, watch=True, _preload_content=False, **params)
    except Exception:
        if observer is not None:
            observer.answered("watch", kind.plural, "error", loop.time() - began)
        raise
    if observer is not None:
        observer.answered("watch", kind.plural, str(response.status), loop.time() - began)
    try:
        if response.status != 200:
            error = ApiException(status=response.status, reason=response.reason)
            error.headers = response.headers
            error.body = await response.read()
            raise error
        async for line in response.content:
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                raise ApiException(status=status.get("code", 500), reason=f"{status.get('reason')}: {status.get('message')}")
            if "type" not in event or "object" not in event:
                raise ApiException(status=500, reason=f"malformed watch event: {line[:200]!r}")
            yield event
    finally:
        response.release()


async def api_client(kubeconfig: str | None, *, in_cluster: bool = False) -> client.ApiClient:
    """An API client: the pod's service account when ``in_cluster`` (``Settings.in_cluster``: in a
    pod, no kubeconfig given), else from the kubeconfig."""
    configuration = client.Configuration()
    if in_cluster and kubeconfig is None:
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)
