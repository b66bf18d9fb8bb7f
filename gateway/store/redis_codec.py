"""How the Redis store encodes what it keeps: compact, so that a session costs few bytes.

A binding is text, its fields joined by ``\x1f`` (no ID may hold a control character)::

    <pool> US <s|h> US <created_at, ms> US <org> US <user> [US <bot> [US <sandbox_id>]]

``s`` is per-session isolation, ``h`` shared; an org that is None is ``\x1e`` (an empty org is
``""``, not None); an org or user that is a canonical lower-case UUID is ``\x1d`` + its 16 bytes in
base64url (22 characters for 36); the sandbox ID is kept only where the binding does not derive it
itself (a per-session ID hashes the session ID, a shared one the owner), and then the bot
(``\x1e`` for none) comes before it. Where a field could not be told from these marks (a control
character in a pool name), the binding is the JSON array ``[pool, isolation, created_at, org, user,
bot(, sandbox_id)]`` that earlier versions wrote, and both forms are read. Every byte counts: a
binding of two UUIDs is 70 bytes (an 80-byte allocation) instead of 118 as JSON (128). A session's
binding to its own per-session sandbox is kept in that sandbox's hash, split in two (``folded``).

A sandbox record is the one-letter fields of its hash (see ``redis_scripts``): ``c`` is written in
whole seconds where it is one (Redis keeps it as an integer), else to the millisecond, and the
owner's ``u``/``b`` in the binding's UUID form; an endpoint is ``"<scheme> <host> <port>[ <unix
socket path>]"``.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from typing import Any

from gateway.model import Binding, Endpoint, Owner, SandboxRecord, SandboxState
from routing import Isolation, per_session_sandbox_id, shared_sandbox_id


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def num(value: float) -> str:
    return repr(float(value))


def seconds(value: float) -> str:
    """A time as few characters as keep it to the millisecond: ``1700000000``, ``1700000000.25``."""
    rounded = round(float(value), 3)
    return str(int(rounded)) if rounded.is_integer() else repr(rounded)


_SEP, _NONE, _UUID = "\x1f", "\x1e", "\x1d"
_UNSAFE = re.compile(r"[\x00-\x1f]")
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ISOLATION = {Isolation.PER_SESSION: "s", Isolation.SHARED: "h"}
_ISOLATION_OF = {mark: kind for kind, mark in _ISOLATION.items()}


def packed_id(value: str) -> str:
    """An ID as stored: a canonical UUID in 23 characters instead of 36, anything else as it is (an
    ID never starts with the mark: IDs hold no control characters)."""
    if len(value) == 36 and _CANONICAL_UUID.fullmatch(value):
        return _UUID + base64.urlsafe_b64encode(uuid.UUID(value).bytes).decode().rstrip("=")
    return value


def unpacked_id(value: str) -> str:
    if value.startswith(_UUID):
        return str(uuid.UUID(bytes=base64.urlsafe_b64decode(value[1:] + "==")))
    return value


def _packed_opt(value: str | None) -> str:
    return _NONE if value is None else packed_id(value)


def _unpacked_opt(value: str) -> str | None:
    return None if value == _NONE else unpacked_id(value)


def record_of(sandbox_id: str, view: list[Any]) -> tuple[SandboxRecord, str]:
    """A record (and its reservation token) from a script's view (see redis_scripts)."""
    state, pool, org, created, endpoint, lease_until, gen, user, bot, owner_org, meta, sessions, last_active = view
    owner = None
    if user is not None:
        owner = Owner(org if owner_org is None else json.loads(owner_org)[0], unpacked_id(user),
                      None if bot is None else unpacked_id(bot))
    record = SandboxRecord(
        sandbox_id, pool, org, SandboxState(state), created_at=float(created or 0.0),
        endpoint=endpoint_of(endpoint) if endpoint else None, last_active=float(last_active),
        sessions=int(sessions or 0), lease_until=float(lease_until or 0.0),
        meta=json.loads(meta) if meta else {}, owner=owner)
    return record, gen or ""


def static_fields(record: SandboxRecord) -> list[str]:
    """The fields written once at reservation, as field, value pairs (absent ones left out)."""
    pairs = ["c", seconds(record.created_at)]
    owner = record.owner
    if owner is not None:
        pairs += ["u", packed_id(owner.user_id)]
        if owner.bot_id is not None:
            pairs += ["b", packed_id(owner.bot_id)]
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
    """A binding as stored (see the module docstring): text where its fields allow, else JSON."""
    owner = binding.owner
    derived = binding.sandbox_id == _derived(binding.session_id, binding.isolation, owner)
    plain = [binding.pool, *(v for v in owner.compact() if v is not None)]
    if not derived:
        plain.append(binding.sandbox_id)
    if binding.pool.startswith("[") or any(_UNSAFE.search(v) for v in plain):
        data: list[Any] = [binding.pool, binding.isolation.value, binding.created_at, *owner.compact()]
        return dumps(data if derived else [*data, binding.sandbox_id])
    fields = [binding.pool, _ISOLATION[binding.isolation], str(round(binding.created_at * 1000)),
              _packed_opt(owner.org_id), packed_id(owner.user_id)]
    if not derived:
        fields += [_packed_opt(owner.bot_id), binding.sandbox_id]
    elif owner.bot_id is not None:
        fields.append(packed_id(owner.bot_id))
    return _SEP.join(fields)


def folded(binding: Binding, value: str) -> tuple[str, str] | None:
    """A per-session binding kept in its own sandbox's hash instead of a key of its own: its head
    (pool, isolation, created) and its tail (the owner), or None where it does not fold (shared, or
    a sandbox ID the session does not derive, or the JSON form). Two fields rather than one, so
    that each stays within a listpack's 64 bytes; ``binding_of`` reads them rejoined."""
    if binding.isolation is not Isolation.PER_SESSION or value.startswith("["):
        return None
    if binding.sandbox_id != per_session_sandbox_id(binding.session_id):
        return None
    pool, mark, millis, tail = value.split(_SEP, 3)
    return _SEP.join((pool, mark, millis)), tail


def binding_of(session_id: str, raw: str) -> Binding:
    if raw.startswith("["):  # the JSON form (earlier versions, and fields the text form cannot carry)
        pool, isolation, created_at, org, user, bot, *sandbox = json.loads(raw)
        kind, created = Isolation(isolation), float(created_at)
    else:
        pool, mark, millis, packed_org, packed_user, *rest = raw.split(_SEP)
        org, user, bot = _unpacked_opt(packed_org), unpacked_id(packed_user), _unpacked_opt(rest[0]) if rest else None
        kind, created, sandbox = _ISOLATION_OF[mark], int(millis) / 1000, rest[1:]
    owner = Owner(org, user, bot)
    return Binding(session_id, sandbox[0] if sandbox else _derived(session_id, kind, owner), pool, kind, owner, created)


def _derived(session_id: str, isolation: Isolation, owner: Owner) -> str:
    if isolation is Isolation.PER_SESSION:
        return per_session_sandbox_id(session_id)
    return shared_sandbox_id(owner.org_id, owner.user_id, owner.bot_id)
