"""Client-side helpers for tests that drive the fake apiserver through kubernetes_asyncio:
object builders, the Ready condition, and `Waiter` (await an object state by watching)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client, watch

SBX, EXT = "agents.x-k8s.io", "extensions.agents.x-k8s.io"
Obj = dict[str, Any]
POD_TEMPLATE: Obj = {"spec": {"containers": [{"name": "runtime", "image": "example/runtime:1",
                                              "ports": [{"containerPort": 8080}]}]}}


def sandbox(name: str, version: str = "v1beta1", labels: dict[str, str] | None = None, **spec: Any) -> Obj:
    """A Sandbox body with a one-container podTemplate; `spec` adds/overrides spec fields."""
    return {"apiVersion": f"{SBX}/{version}", "kind": "Sandbox", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"podTemplate": copy.deepcopy(POD_TEMPLATE), **spec}}


def ext(kind: str, name: str, version: str, spec: Obj) -> Obj:
    """An extensions.agents.x-k8s.io body (SandboxClaim, SandboxTemplate, SandboxWarmPool)."""
    return {"apiVersion": f"{EXT}/{version}", "kind": kind, "metadata": {"name": name}, "spec": spec}


def template(name: str = "tpl", version: str = "v1beta1", **spec: Any) -> Obj:
    return ext("SandboxTemplate", name, version, {"podTemplate": copy.deepcopy(POD_TEMPLATE), **spec})


def ready(obj: Obj | None) -> Obj:
    """The Ready condition of `obj` ({} if none)."""
    return next((c for c in (obj or {}).get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})


class Waiter:
    """Awaits object states through watch events, reusing one kubernetes_asyncio Watch (every
    `Watch()` builds its own ApiClient and SSL context: ~0.05-0.1 s of CPU each)."""

    def __init__(self, namespace: str = "default") -> None:
        self.namespace = namespace
        self._watch = watch.Watch()

    async def __call__(self, api: client.CustomObjectsApi, group: str, version: str, plural: str, name: str,
                       predicate: Callable[[Obj], bool], timeout: float = 5.0) -> Obj:
        """The first state of the object (current state first, then watch events) satisfying `predicate`."""
        event = await self._first(api, group, version, plural, name, None, timeout,
                                  lambda e: e["type"] != "DELETED" and predicate(e["object"]))
        return event["object"]

    async def deleted(self, api: client.CustomObjectsApi, name: str, since: str, plural: str = "sandboxes",
                      group: str = SBX, version: str = "v1beta1", timeout: float = 5.0) -> Obj:
        """The DELETED event of `name`, watching from resourceVersion `since`."""
        return await self._first(api, group, version, plural, name, since, timeout, lambda e: e["type"] == "DELETED")

    async def _first(self, api: client.CustomObjectsApi, group: str, version: str, plural: str, name: str,
                     since: str | None, timeout: float, match: Callable[[Obj], bool]) -> Obj:
        if self._watch.resp is not None:  # the previous stream was left early: recycle the Watch
            self._watch.resp.release()
            self._watch.resp = None
        kwargs = {"resource_version": since} if since else {}
        async with asyncio.timeout(timeout):
            async for event in self._watch.stream(api.list_namespaced_custom_object, group, version, self.namespace,
                                                  plural, field_selector=f"metadata.name={name}", **kwargs):
                if match(event):
                    return event
        raise AssertionError(f"the watch on {plural}/{name} ended without a matching event")

    async def close(self) -> None:
        await self._watch.close()
