"""Sandbox IDs, byte-compatible with Kilo cloud-agent-next (PR #1147).

The rules (ARCHITECTURE.md, "Sandbox IDs") are reproduced exactly, including
the edge cases that look accidental but that live deployments depend on:

* the org *segment* uses a None check (an empty-string org stays ``""``), while
  the *prefix* uses truthiness (an empty org gives ``usr``/``ubt``);
* the bot is tested by truthiness for both the hashed string and the prefix;
* ``*`` in the per-session list applies even when there is no org.

SHA-256 is deliberate: the inputs are caller-chosen, so a non-cryptographic
hash would let a caller craft a collision with another tenant's sandbox.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

HASH_HEX_CHARS = 48
SANDBOX_ID_LENGTH = 3 + 1 + HASH_HEX_CHARS  # prefix, dash, hash: 52
PER_SESSION_PREFIX = "ses"
WILDCARD = "*"

_VALID_ID = re.compile(r"(?:ses|org|usr|bot|ubt)-[0-9a-f]+")


def _hash48(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_HEX_CHARS]


def per_session_sandbox_id(session_id: str) -> str:
    """``ses-`` + 48 hex of SHA-256(session_id): one sandbox per session."""
    return f"{PER_SESSION_PREFIX}-{_hash48(session_id)}"


def shared_sandbox_id(org_id: str | None, user_id: str, bot_id: str | None = None) -> str:
    """The shared sandbox of an org (or personal account), optionally per bot."""
    segment = org_id if org_id is not None else f"user:{user_id}"
    hashed = f"{segment}__{user_id}__bot:{bot_id}" if bot_id else f"{segment}__{user_id}"
    if bot_id:
        prefix = "bot" if org_id else "ubt"
    else:
        prefix = "org" if org_id else "usr"
    return f"{prefix}-{_hash48(hashed)}"


def parse_org_list(raw: str | None) -> frozenset[str]:
    """Kilo's ``PER_SESSION_SANDBOX_ORG_IDS``: split on ``,``, trim, drop empties."""
    if not raw:
        return frozenset()
    return frozenset(entry.strip() for entry in raw.split(",") if entry.strip())


def is_per_session_org(org_ids: Iterable[str] | frozenset[str], org_id: str | None) -> bool:
    """True when the list holds ``*``, or holds this (non-None) org."""
    orgs = org_ids if isinstance(org_ids, frozenset) else frozenset(org_ids)
    return WILDCARD in orgs or (org_id is not None and org_id in orgs)


def is_valid_sandbox_id(value: str) -> bool:
    """A generated ID (``ses|org|usr|bot|ubt`` + ``-`` + lowercase hex), or a legacy ``__`` ID."""
    if not isinstance(value, str) or not value:
        return False
    return _VALID_ID.fullmatch(value) is not None or "__" in value


def sandbox_id_prefix(sandbox_id: str) -> str:
    """The three-letter prefix of a generated ID, ``""`` for legacy IDs."""
    head, sep, _ = sandbox_id.partition("-")
    return head if sep and _VALID_ID.fullmatch(sandbox_id) else ""
