"""The hosts the gateway answers for (``allowed_hosts``): a defence against DNS rebinding.

A web page a user visits can re-point its own name at 127.0.0.1 (or at a gateway on a private
network) and then talk to the gateway as a same-origin page: the browser still believes it talks
to ``attacker.example``, and sends ``Host: attacker.example``. A gateway that answers any Host
hands that page the control API and every sandbox the loopback trust admits. So both the data
plane and the control API answer only names they serve; any other ``Host`` gets 421
``host_not_allowed``.

Always answered, whatever the setting says:

- **IP literals** (``127.0.0.1:8080``, ``[::1]``, a pod IP): rebinding needs a name; a page whose
  address is an IP literal is that address's own origin. Kubelet probes and Prometheus scrape by
  pod IP.
- **No Host at all** (HTTP/1.0): no browser sends such a request.
- the preview domain's hosts (``*.{preview_domain}``) and ``public_url``'s host.

Beyond those, ``allowed_hosts`` lists names (``gw.example.com``, or ``.example.com`` for every name
under it) or ``*`` (any name: only behind a proxy that checks Host itself). Unset, it is
``localhost`` and its subdomains when the gateway listens on loopback; off loopback the operator
must say (``Settings`` refuses to start otherwise).

Pure: no I/O. The data plane asks :meth:`AllowedHosts.allows` per request; the answer is cached
per raw ``Host`` value (bounded), so a request pays one dict lookup.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from gateway.errors import MisdirectedRequest

ALLOWED_HOSTS_SETTING = "allowed_hosts (SANDBOX_GATEWAY_ALLOWED_HOSTS)"
LOOPBACK_NAMES = ("localhost", ".localhost")
_CACHE_LIMIT = 4096


class AllowedHosts:
    """Which ``Host`` values this gateway answers (see the module docstring)."""

    def __init__(self, names: Iterable[str], *, preview_domain: str | None = None,
                 public_url: str | None = None) -> None:
        exact: set[str] = set()
        suffixes: list[str] = []
        self.any = False
        listed = list(names)
        if preview_domain:
            listed.append("." + preview_domain)
        if public_url:
            host = urlsplit(public_url).hostname
            if host:
                listed.append(host)
        for name in listed:
            name = name.strip().lower().rstrip(".")
            if name == "*":
                self.any = True
            elif name.startswith("."):
                suffixes.append(name)
            elif name:
                exact.add(name)
        self._exact = frozenset(exact)
        self._suffixes = tuple(suffixes)
        self._cache: dict[bytes, bool] = {}

    def allows(self, host: bytes | None) -> bool:
        """Whether a request with this raw ``Host`` value (port included) is ours to answer."""
        if host is None or self.any:
            return True
        known = self._cache.get(host)
        if known is None:
            known = self._decide(host)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()  # a flood of distinct names: start over rather than grow
            self._cache[host] = known
        return known

    def _decide(self, raw: bytes) -> bool:
        try:
            text = raw.decode("ascii").strip().lower()
        except UnicodeDecodeError:
            return False
        name = _name_of(text)
        if name is None:
            return False
        if _is_ip_literal(name):
            return True
        name = name.rstrip(".")
        return name in self._exact or any(name.endswith(suffix) or name == suffix[1:] for suffix in self._suffixes)

    def describe(self) -> str:
        if self.any:
            return "any host"
        return ", ".join(sorted(self._exact) + [f"*{suffix}" for suffix in self._suffixes]) or "IP addresses only"


def host_not_allowed(host: str | bytes | None) -> MisdirectedRequest:
    """The refusal of a ``Host`` outside ``allowed_hosts``, the same on the data plane and the control API."""
    shown = host.decode("latin-1") if isinstance(host, bytes) else host
    return MisdirectedRequest(f"this gateway does not answer for Host {shown!r}: add the name to "
                              f"{ALLOWED_HOSTS_SETTING}", code="host_not_allowed")


def _name_of(authority: str) -> str | None:
    """The host part of a ``Host`` value (``[::1]:80`` -> ``::1``), None when it is malformed."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0 or (authority[end + 1:] and not authority[end + 1:].startswith(":")):
            return None
        return authority[1:end]
    name, _, port = authority.partition(":")
    if port and not port.isdigit():
        return None
    return name or None


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def default_allowed_hosts(host: str) -> list[str] | None:
    """``allowed_hosts`` when unset: the localhost names for a loopback listener, else None (must be set)."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return list(LOOPBACK_NAMES) if loopback else None


__all__ = ["ALLOWED_HOSTS_SETTING", "AllowedHosts", "default_allowed_hosts", "host_not_allowed"]
