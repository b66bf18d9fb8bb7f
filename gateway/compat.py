"""The agent-sandbox router's headers, for clients written against that router (off by default).

agent-sandbox's sandbox-router sends a request carrying ``X-Sandbox-ID`` (with
``X-Sandbox-Namespace``, default ``default``, and ``X-Sandbox-Port``, default
8888) to ``{id}.{namespace}.svc.cluster.local:{port}``. Honoured as is, that
lets anyone who can reach the router reach any sandbox in the cluster, on any
port. Here the headers only select among what the operator allowed:

- only with an admin token (``Authorization``, the control API's audience): a
  tenant's data-plane token or trusted identity headers are never enough;
- only in the namespaces on ``router_compat_namespaces`` and only on the ports on
  ``router_compat_ports``;
- the address dialled is the pod IP the Sandbox's own status reports, read from
  the Kubernetes API, never a host name built from what the caller sent.

With ``router_compat_namespaces`` empty (the default) the data plane drops the
three headers and routes by identity as usual.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from gateway.auth import AdminCheck
from gateway.errors import BadRequest, Forbidden
from gateway.model import Endpoint, Owner, Route

DEFAULT_NAMESPACE = "default"
DEFAULT_PORT = 8888
POOL = "router-compat"          # the pool label of compat routes in metrics and logs
OWNER = Owner(None, "router-compat", None)
_NAME = re.compile(rb"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a Kubernetes object name (DNS subdomain)
_LOCATE_TTL = 5.0               # how long a located pod IP is used without asking the API again
_CACHE_LIMIT = 10_000


class SandboxLocator(Protocol):
    """Where a Sandbox runs; ``gateway.compat_locator.KubernetesSandboxLocator`` reads it from the API."""

    async def locate(self, namespace: str, name: str) -> str:
        """The pod IP of Sandbox ``name`` in ``namespace``; a GatewayError when there is none to route to."""


Target = tuple[str, str, int]   # namespace, name, port


class RouterCompat:
    """Checks a request's router headers (``target``) and finds the Sandbox's pod (``route``)."""

    def __init__(self, namespaces: Iterable[str], ports: Iterable[int], admin: AdminCheck, locator: SandboxLocator,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self._namespaces = frozenset(namespaces)
        self._ports = frozenset(ports)
        self._admin = admin
        self._locator = locator
        self._clock = clock
        self._located: dict[tuple[str, str], tuple[str, float]] = {}

    def target(self, sandbox: bytes, namespace: bytes | None, port: bytes | None,
               authorization: bytes | None) -> Target:
        """Check a request's router headers and admin token (in that order of trust: the token first,
        so a caller without one learns nothing about the allow-lists)."""
        self._admin.check(authorization.decode("latin-1") if authorization is not None else None)
        if not _NAME.fullmatch(sandbox):
            raise BadRequest("X-Sandbox-ID: must be a Kubernetes object name (lower-case letters, digits, '-', '.')",
                             code="invalid_sandbox_header")
        ns = DEFAULT_NAMESPACE if namespace is None else namespace.decode("latin-1")
        if ns not in self._namespaces:
            raise Forbidden(f"X-Sandbox-Namespace: {ns!r} is not in router_compat_namespaces",
                            code="namespace_not_allowed")
        if port is None:
            number = DEFAULT_PORT
        elif port.isdigit() and len(port) <= 5:
            number = int(port)
        else:
            raise BadRequest("X-Sandbox-Port: must be a port number", code="invalid_sandbox_header")
        if number not in self._ports:
            raise Forbidden(f"X-Sandbox-Port: {number} is not in router_compat_ports", code="port_not_allowed")
        return ns, sandbox.decode("ascii"), number

    async def route(self, target: Target) -> Route:
        namespace, name, port = target
        key = (namespace, name)
        now = self._clock()
        located = self._located.get(key)
        if located is None or located[1] <= now:
            ip = await self._locator.locate(namespace, name)
            if len(self._located) >= _CACHE_LIMIT:
                self._located.pop(next(iter(self._located)))
            self._located[key] = (ip, now + _LOCATE_TTL)
        else:
            ip = located[0]
        return Route("", name, POOL, Endpoint(ip, port), OWNER)

    def forget(self, target: Target) -> None:
        """The located address did not answer: ask the API next time."""
        self._located.pop(target[:2], None)  # type: ignore[arg-type]


__all__ = ["RouterCompat", "SandboxLocator", "Target"]
