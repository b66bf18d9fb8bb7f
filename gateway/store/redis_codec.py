"""How the Redis store encodes what it keeps: compact, so that a session costs few bytes.

A binding is a JSON array, ``[pool, isolation, created_at, org, user, bot]``, plus the sandbox ID
only where the binding does not derive it itself (a per-session ID hashes the session ID, a shared
one the owner). A sandbox record is the one-letter fields of its hash (see ``redis_scripts``);
an endpoint is ``"<scheme> <host> <port>[ <unix socket path>]"``.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.model import Binding, Endpoint, Owner, SandboxRecord, SandboxState
from routing import Isolation, per_session_sandbox_id, shared_sandbox_id


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def num(value: float) -> str:
    return repr(float(value))


def record_of(sandbox_id: str, view: list[Any]) -> tuple[SandboxRecord, str]:
    """A record (and its reservation token) from a script's view (see redis_scripts)."""
    state, pool, org, created, endpoint, lease_until, gen, user, bot, owner_org, meta, sessions, last_active = view
    owner = None
    if user is not None:
        owner = Owner(org if owner_org is None else json.loads(owner_org)[0], user, bot)
    record = SandboxRecord(
        sandbox_id, pool, org, SandboxState(state), created_at=float(created or 0.0),
        endpoint=endpoint_of(endpoint) if endpoint else None, last_active=float(last_active),
        sessions=int(sessions or 0), lease_until=float(lease_until or 0.0),
        meta=json.loads(meta) if meta else {}, owner=owner)
    return record, gen or ""


def static_fields(record: SandboxRecord) -> list[str]:
    """The fields written once at reservation, as field, value pairs (absent ones left out)."""
    pairs = ["c", num(record.created_at)]
    owner = record.owner
    if owner is not None:
        pairs += ["u", owner.user_id]
        if owner.bot_id is not None:
            pairs += ["b", owner.bot_id]
        if owner.org_id != record.org_id:
            pairs += ["v", dumps([owner.org_id])]
    if record.meta:
        pairs += ["m", dumps(record.meta)]
    return pairs


def endpoint_text(endpoint: Endpoint) -> str:
    """``scheme host port``, then a confined local sandbox's Unix socket path (the rest of the text: a
    path may hold spaces; hosts are addresses or DNS names and never do)."""
    text = f"{endpoint.scheme} {endpoint.host} {endpoint.port}"
    return text if endpoint.unix is None else f"{text} {endpoint.unix}"


def endpoint_of(text: str) -> Endpoint:
    scheme, host, port, *unix = text.split(" ", 3)
    return Endpoint(host, int(port), scheme, unix=unix[0] if unix else None)


def binding_value(binding: Binding) -> str:
    """A binding as stored: ``[pool, isolation, created_at, org, user, bot]``, plus the sandbox ID
    only where it is not the one the binding itself derives (a session ID or an owner hashes to it)."""
    data: list[Any] = [binding.pool, binding.isolation.value, binding.created_at, *binding.owner.compact()]
    if binding.sandbox_id != _derived(binding.session_id, binding.isolation, binding.owner):
        data.append(binding.sandbox_id)
    return dumps(data)


def binding_of(session_id: str, raw: str) -> Binding:
    pool, isolation, created_at, org, user, bot, *sandbox = json.loads(raw)
    owner = Owner(org, user, bot)
    kind = Isolation(isolation)
    return Binding(session_id, sandbox[0] if sandbox else _derived(session_id, kind, owner), pool, kind, owner,
                   float(created_at))


def _derived(session_id: str, isolation: Isolation, owner: Owner) -> str:
    if isolation is Isolation.PER_SESSION:
        return per_session_sandbox_id(session_id)
    return shared_sandbox_id(owner.org_id, owner.user_id, owner.bot_id)
