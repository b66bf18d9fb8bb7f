"""Access grants: what the control API hands a session's owner to reach its sandbox by URL.

A :class:`Grant` is a sandbox access token (``gateway.access``) for some ports of one sandbox, its
expiry, and the ready-made URLs that the data plane's keys (``gateway.proxy._keys``) accept for it:

- **host** ``{scheme}://{port}-{sandbox_id}.{preview_domain}[:{port of public_url}]/`` when
  ``preview_domain`` is set;
- **path** ``{public_url}{preview_path_prefix}/{sandbox_id}/{port}/`` when ``preview_path_prefix``
  is set.

Each URL carries ``?access_token=`` so it opens as it is (the data plane swaps the parameter for a
cookie and redirects it out of the address bar); the bare token goes in ``Authorization: Bearer``.
A port range in a grant has one URL template with ``{port}`` in it, for the client to fill in;
a few adjacent ports (a policy's ``ports: [19300, 19301]``, which the port set keeps as one range)
get one URL each, as single ports do.

``public_url`` (the data plane as clients reach it) is a setting; without it the URLs name the
host the caller reached the control API by, on the data plane's port, over plain HTTP: right for
a gateway on one machine, to be set for anything behind a load balancer.

:class:`NoGrants` is the null object for a gateway without signing keys: every call names the
setting to add. Pure: no I/O; the caller finds the sandbox record and checks ownership.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from gateway.access import QUERY_PARAM, AccessTokens, incarnation_of
from gateway.errors import BadRequest, Forbidden, NotImplementedByGateway
from gateway.model import SandboxRecord
from routing.ports import PortSet


@dataclass(frozen=True, slots=True)
class Grant:
    sandbox_id: str
    token: str
    expires_at: float
    ports: PortSet
    urls: list[dict[str, Any]]   # [{"port": 3000 | "3000-3999", "host": url | None, "path": url | None}]

    def as_dict(self) -> dict[str, Any]:
        return {"sandbox_id": self.sandbox_id, "token": self.token, "expires_at": self.expires_at,
                "ports": self.ports.to_list(), "urls": self.urls,
                "headers": {"Authorization": f"Bearer {self.token}"}}

    def path_url(self, port: int, path: str = "/") -> str | None:
        """The path URL of ``port`` with ``path`` under it (kagent's ``mcp_url``), token included."""
        for entry in self.urls:
            if entry["port"] == port and entry["path"] is not None:
                base, _, query = entry["path"].partition("?")
                return base.rstrip("/") + path + "?" + query
        return None


@dataclass(frozen=True, slots=True)
class McpTarget:
    """Where kagent's ``mcp_url`` points inside a sandbox: ``port`` (None: its runtime port) and ``path``."""

    port: int | None = None
    path: str = "/mcp"


class Grants(Protocol):
    def grant(self, record: SandboxRecord, allowed: PortSet, *, ports: Any = None, ttl: Any = None,
              request_host: str | None = None) -> Grant:
        """A grant for ``ports`` (default: all of ``allowed``) of the sandbox in ``record``."""


class NoGrants:
    """No signing keys: no access tokens (and no preview URLs) on this gateway."""

    def grant(self, record: SandboxRecord, allowed: PortSet, *, ports: Any = None, ttl: Any = None,
              request_host: str | None = None) -> Grant:
        raise NotImplementedByGateway(
            "this gateway mints no sandbox access tokens: set auth_keys_file (SANDBOX_GATEWAY_AUTH_KEYS_FILE) to a "
            "key file with a signing key (see examples/auth/keys.yaml)", code="access_tokens_off")


class AccessGrants:
    """Mints grants with the gateway's access tokens and builds their URLs from the settings."""

    def __init__(self, tokens: AccessTokens, *, data_port: int, public_url: str | None = None,
                 preview_domain: str | None = None, path_prefix: str | None = None) -> None:
        self.tokens = tokens
        self.data_port = data_port
        self.public_url = public_url.rstrip("/") if public_url else None
        self.preview_domain = preview_domain
        self.path_prefix = path_prefix.rstrip("/") if path_prefix else None

    def grant(self, record: SandboxRecord, allowed: PortSet, *, ports: Any = None, ttl: Any = None,
              request_host: str | None = None) -> Grant:
        wanted = allowed if ports is None else _ports(ports)
        if not wanted.issubset(allowed):
            raise Forbidden(f"ports: {wanted.describe()} is not among the ports this sandbox's pool opens "
                            f"({allowed.describe()}); ask for those, or add them to the pool's ports in the policy",
                            code="port_not_allowed")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)):
            raise BadRequest("ttl: must be a number of seconds", code="invalid_ttl")
        token = self.tokens.mint(record.sandbox_id, incarnation_of(record.created_at), wanted, ttl)
        expires = self.tokens.verify(token).expires
        base = self._base(request_host)
        urls = [self._urls(record.sandbox_id, low, high, token, base) for low, high in _listed(wanted)]
        return Grant(record.sandbox_id, token, expires, wanted, urls)

    def _base(self, request_host: str | None) -> str:
        if self.public_url is not None:
            return self.public_url
        host = urlsplit(f"//{request_host or '127.0.0.1'}").hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.data_port}"

    def _urls(self, sandbox_id: str, low: int, high: int, token: str, base: str) -> dict[str, Any]:
        port: int | str = low if low == high else f"{low}-{high}"
        shown = str(low) if low == high else "{port}"
        query = f"?{QUERY_PARAM}={quote(token, safe='')}"
        host_url = path_url = None
        if self.preview_domain is not None:
            parts = urlsplit(base)
            suffix = f":{parts.port}" if parts.port is not None else ""
            host_url = f"{parts.scheme}://{shown}-{sandbox_id}.{self.preview_domain}{suffix}/{query}"
        if self.path_prefix is not None:
            path_url = f"{base}{self.path_prefix}/{sandbox_id}/{shown}/{query}"
        return {"port": port, "host": host_url, "path": path_url}


_EACH_UP_TO = 16  # a range of at most this many ports is listed port by port, not as a {port} template


def _listed(ports: PortSet) -> list[tuple[int, int]]:
    """The (low, high) entries a grant lists: small ranges split into their ports."""
    out: list[tuple[int, int]] = []
    for low, high in ports.ranges:
        if high - low < _EACH_UP_TO:
            out += [(port, port) for port in range(low, high + 1)]
        else:
            out.append((low, high))
    return out


def _ports(raw: Any) -> PortSet:
    try:
        return PortSet.parse(raw)
    except ValueError as exc:
        raise BadRequest(f"ports: {exc}", code="invalid_ports") from None


__all__ = ["AccessGrants", "Grant", "Grants", "McpTarget", "NoGrants"]
