"""Domain values shared by the store, the providers, the session router and the control API
(a place in the sandbox listing and its filter: ``Position``, ``SandboxFilter``).

Plain frozen dataclasses: they cross process boundaries (Redis, JSON), so they
carry only data, and ``to_dict``/``from_dict`` are their one serialisation.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from gateway.errors import BadRequest
from routing import Identity, Isolation, shared_sandbox_id


class SandboxState(StrEnum):
    """``creating`` -> ``ready`` -> (``suspending`` -> ``suspended`` -> ``resuming`` -> ``ready``)*.

    All but ``suspended`` and ``deleting`` count against the caps. ``deleting`` is the reaper's delete
    in progress (claimed under a lease; a request waits for it, then creates the sandbox anew);
    ``failed`` is never stored (a failed creation releases its record)."""

    CREATING = "creating"
    READY = "ready"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    RESUMING = "resuming"
    FAILED = "failed"
    DELETING = "deleting"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a sandbox answers. Only providers produce these; callers never choose one.

    ``unix``, when set, is a Unix socket path to connect to instead of ``host:port`` (a confined
    local sandbox, which has no network the gateway shares). ``host`` and ``port`` still name
    it (the Host header, the upstream pool key), so they must be unique to the sandbox. Such a
    sandbox answers gRPC on a second socket beside it (:attr:`grpc_unix`).
    """

    host: str
    port: int
    scheme: str = "http"
    unix: str | None = None

    def url(self) -> str:
        if self.unix is not None:
            return f"unix:{self.unix}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def grpc_unix(self) -> str | None:
        """The Unix socket of the sandbox's gRPC service: ``unix`` with ``.grpc`` for ``.sock`` (the
        local provider binds both; one name per start, as the HTTP one). None for a TCP endpoint."""
        if self.unix is None:
            return None
        return self.unix.removesuffix(".sock") + ".grpc"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"host": self.host, "port": self.port, "scheme": self.scheme}
        if self.unix is not None:
            data["unix"] = self.unix
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Endpoint:
        return cls(host=data["host"], port=int(data["port"]), scheme=data.get("scheme", "http"),
                   unix=data.get("unix"))


@dataclass(frozen=True, slots=True)
class Owner:
    """Who owns a binding: everything in an identity but the session."""

    org_id: str | None
    user_id: str
    bot_id: str | None

    @classmethod
    def of(cls, identity: Identity) -> Owner:
        return cls(identity.org_id, identity.user_id, identity.bot_id)

    def matches(self, identity: Identity) -> bool:
        # Field by field, not as two tuples: every request routed from the cache checks its owner (route_cache.py).
        return (self.user_id == identity.user_id and self.org_id == identity.org_id
                and self.bot_id == identity.bot_id)

    def compact(self) -> list[str | None]:
        """``[org_id, user_id, bot_id]``: how a sandbox's owner is stored (Redis, registries)."""
        return [self.org_id, self.user_id, self.bot_id]

    @classmethod
    def from_compact(cls, data: Any) -> Owner | None:
        """The owner from ``compact()``; None for anything else (a record of an older version has none)."""
        if (isinstance(data, list) and len(data) == 3 and isinstance(data[1], str)
                and all(v is None or isinstance(v, str) for v in data)):
            return cls(data[0], data[1], data[2])
        return None


def may_claim(sandbox_id: str, recorded: Owner | None, made_at: float, claimant: Owner, bound_at: float) -> bool:
    """Whether ``claimant``, bound to ``sandbox_id`` at ``bound_at``, may use the live sandbox of that ID.

    A sandbox serves only its owner: the identity it was created for (for ``ses-`` IDs, which
    hash the caller-chosen session ID alone, the session's owner). ``recorded`` is None for a
    sandbox an older version created without an owner; it is claimed only on evidence:

    - a shared ID (``org-``/``usr-``/``bot-``/``ubt-``) is the SHA-256 of its owner's org, user
      and bot: when it re-derives from ``claimant``, the ID itself proves the owner;
    - otherwise (``ses-``, legacy IDs) the binding must predate the sandbox (``bound_at <=
      made_at``): it is the binding the sandbox was created for. A binding made after the
      sandbox (its own was lost) proves nothing, and the sandbox is refused to everyone until
      it is reaped or swept.
    """
    if recorded is not None:
        return recorded == claimant
    if shared_sandbox_id(claimant.org_id, claimant.user_id, claimant.bot_id) == sandbox_id:
        return True
    return bound_at <= made_at


@dataclass(frozen=True, slots=True)
class Route:
    """Everything the data plane needs to forward one request: the session layer's answer."""

    session_id: str
    sandbox_id: str
    pool: str
    endpoint: Endpoint
    owner: Owner


@dataclass(frozen=True, slots=True)
class Binding:
    """A session's sandbox, fixed for the life of the session (a stored binding wins)."""

    session_id: str
    sandbox_id: str
    pool: str
    isolation: Isolation
    owner: Owner
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["isolation"] = self.isolation.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Binding:
        return cls(
            session_id=data["session_id"],
            sandbox_id=data["sandbox_id"],
            pool=data["pool"],
            isolation=Isolation(data["isolation"]),
            owner=Owner(**data["owner"]),
            created_at=float(data["created_at"]),
        )


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """A sandbox as the store knows it. ``org_id`` is what the org cap counts by; ``owner`` is the
    identity it serves (None only for records written by a version that kept no owner)."""

    sandbox_id: str
    pool: str
    org_id: str | None
    state: SandboxState
    created_at: float
    endpoint: Endpoint | None = None
    last_active: float = 0.0
    sessions: int = 0
    lease_until: float = 0.0
    meta: dict[str, str] = field(default_factory=dict)
    owner: Owner | None = None

    def with_(self, **changes: Any) -> SandboxRecord:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        data["owner"] = self.owner.compact() if self.owner is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SandboxRecord:
        endpoint = data.get("endpoint")
        return cls(
            sandbox_id=data["sandbox_id"],
            pool=data["pool"],
            org_id=data.get("org_id"),
            state=SandboxState(data["state"]),
            created_at=float(data["created_at"]),
            endpoint=Endpoint.from_dict(endpoint) if endpoint else None,
            last_active=float(data.get("last_active", 0.0)),
            sessions=int(data.get("sessions", 0)),
            lease_until=float(data.get("lease_until", 0.0)),
            meta=dict(data.get("meta") or {}),
            owner=Owner.from_compact(data.get("owner")),
        )


@dataclass(frozen=True, slots=True)
class SandboxRequest:
    """What a provider needs to create a sandbox; the identity goes into annotations.

    ``owner`` is recorded with the sandbox (registry entry, annotations); a provider adopts an
    existing sandbox only when ``may_claim`` allows it, with ``bound_at`` the binding's creation
    time (the default, infinitely late, proves nothing).
    """

    sandbox_id: str
    pool: str
    isolation: Isolation
    owner: Owner
    session_id: str
    timeout: float
    bound_at: float = float("inf")

    def may_claim(self, recorded: Owner | None, made_at: float) -> bool:
        return may_claim(self.sandbox_id, recorded, made_at, self.owner, self.bound_at)


@dataclass(frozen=True, slots=True)
class ManagedSandbox:
    """A sandbox as a provider sees it (for orphan sweeps)."""

    sandbox_id: str
    pool: str
    created_at: float


@dataclass(frozen=True, slots=True)
class Position:
    """A place in the sandbox index, ordered by (last activity, sandbox ID), oldest first.

    Paging by it never skips a sandbox that exists throughout: activity only moves an entry
    forward (towards pages not yet read), so an entry touched while a caller pages may come
    again on a later page, but none can move behind the caller.
    """

    last_active: float
    sandbox_id: str

    def encode(self) -> str:
        """The opaque cursor a client is handed (``next_cursor``)."""
        raw = json.dumps([repr(self.last_active), self.sandbox_id], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, cursor: str, parameter: str = "cursor") -> Position:
        """The position of ``encode()``; ``BadRequest`` naming ``parameter`` for anything else."""
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            last_active, sandbox_id = json.loads(raw)
            if isinstance(last_active, str) and isinstance(sandbox_id, str) and sandbox_id:
                position = cls(float(last_active), sandbox_id)
                if math.isfinite(position.last_active):
                    return position
        except (binascii.Error, ValueError, TypeError):  # UnicodeDecodeError is a ValueError
            pass
        raise BadRequest(f"{parameter} is not a cursor this gateway handed out; "
                         f"pass the next_cursor of the previous page, or omit {parameter} to start over")

    def key(self) -> tuple[float, str]:
        return (self.last_active, self.sandbox_id)


@dataclass(frozen=True, slots=True)
class SandboxFilter:
    """Which records a scan returns (None: any)."""

    pool: str | None = None
    state: SandboxState | None = None
    org_id: str | None = None

    @property
    def any(self) -> bool:
        return self.pool is None and self.state is None and self.org_id is None

    def matches(self, record: SandboxRecord) -> bool:
        return ((self.pool is None or record.pool == self.pool)
                and (self.state is None or record.state is self.state)
                and (self.org_id is None or record.org_id == self.org_id))


ANY_SANDBOX = SandboxFilter()
