"""Where an agent-sandbox ``Sandbox`` runs, read from the Kubernetes API: the locator the router
headers (``gateway.compat``) dial through.

Only ``get`` on sandboxes (``LOCATOR_RBAC_RULES``), in the namespaces ``RouterCompat`` allows;
the Helm chart grants exactly that in each ``router_compat_namespaces`` entry. Imported only
when the router headers are on, so a gateway without them never loads the Kubernetes client.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from gateway.errors import NotFound, ProvisionFailed
from gateway.providers.kubernetes_api import api_client, read_object, routable_pod_ip, sandbox_kind

# What the locator calls in each router_compat_namespaces entry (the chart's router-compat Roles).
LOCATOR_RBAC_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["get"]},
)


class KubernetesSandboxLocator:
    """The pod IP of a ``Sandbox`` by namespace and name: ``gateway.compat.SandboxLocator``."""

    def __init__(self, api_version: str, *, kubeconfig: str | None = None, in_cluster: bool = False,
                 api_client_: client.ApiClient | None = None) -> None:
        self._kind = sandbox_kind(api_version)
        self._kubeconfig = kubeconfig
        self._in_cluster = in_cluster
        self._api_client = api_client_
        self._owns_client = api_client_ is None

    async def start(self) -> None:
        if self._api_client is None:
            self._api_client = await api_client(self._kubeconfig, in_cluster=self._in_cluster)

    async def close(self) -> None:
        if self._owns_client and self._api_client is not None:
            await self._api_client.close()

    async def locate(self, namespace: str, name: str) -> str:
        """The Sandbox's pod IP; ``NotFound`` when there is no such Sandbox, 503 while it is not routable."""
        assert self._api_client is not None, "start() first"
        obj = await read_object(client.CustomObjectsApi(self._api_client), self._kind, namespace, name)
        if obj is None:
            raise NotFound(f"no Sandbox {name!r} in namespace {namespace!r}", code="sandbox_not_found")
        ip = routable_pod_ip(obj)
        if ip is None:
            raise ProvisionFailed(f"Sandbox {namespace}/{name} is not ready (no Ready condition with a pod IP)",
                                  code="sandbox_not_ready", sandbox_id=name, retry_after=1.0)
        return ip
