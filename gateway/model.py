"""Domain values shared by the store, the providers and the session router.

Plain frozen dataclasses: they cross process boundaries (Redis, JSON), so they
carry only data, and ``to_dict``/``from_dict`` are their one serialisation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from routing import Identity, Isolation


class SandboxState(StrEnum):
    CREATING = "creating"
    READY = "ready"
    FAILED = "failed"
    DELETING = "deleting"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a sandbox answers. Only providers produce these; callers never choose one."""

    host: str
    port: int
    scheme: str = "http"

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Endpoint:
        return cls(host=data["host"], port=int(data["port"]), scheme=data.get("scheme", "http"))


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
        return (self.org_id, self.user_id, self.bot_id) == (identity.org_id, identity.user_id, identity.bot_id)


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
    """A sandbox as the store knows it. ``org_id`` is what the org cap counts by."""

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

    def with_(self, **changes: Any) -> SandboxRecord:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
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
        )


@dataclass(frozen=True, slots=True)
class SandboxRequest:
    """What a provider needs to create a sandbox; the identity goes into annotations."""

    sandbox_id: str
    pool: str
    isolation: Isolation
    owner: Owner
    session_id: str
    timeout: float


@dataclass(frozen=True, slots=True)
class ManagedSandbox:
    """A sandbox as a provider sees it (for orphan sweeps)."""

    sandbox_id: str
    pool: str
    created_at: float
