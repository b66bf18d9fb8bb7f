"""Placement: identity + policy -> which sandbox, in which pool, how isolated.

``pool_for`` is the analogue of Kilo's ``getSandboxNamespace``: the pool is a
function of the sandbox ID's prefix alone (``ses-`` -> the small pool, all else,
legacy ``__`` IDs included, -> the default pool), unless an org override names
a pool. A stored binding remembers the pool it was placed in, so a later policy
change never moves a live session.
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.identity import Identity
from routing.ids import is_per_session_org, per_session_sandbox_id, sandbox_id_prefix, shared_sandbox_id
from routing.policy import Isolation, Policy


@dataclass(frozen=True, slots=True)
class Placement:
    sandbox_id: str
    pool: str
    isolation: Isolation

    def as_dict(self) -> dict[str, str]:
        return {"sandbox_id": self.sandbox_id, "pool": self.pool, "isolation": self.isolation.value}


def pool_for(sandbox_id: str, policy: Policy) -> str:
    """The pool a sandbox ID belongs to by its prefix; legacy IDs go to the default pool."""
    prefix = sandbox_id_prefix(sandbox_id)
    return policy.prefix_pools.get(prefix, policy.default_pool) if prefix else policy.default_pool


def isolation_for(identity: Identity, policy: Policy) -> Isolation:
    """Per-org override first, then Kilo's per-session list rule (``*`` included)."""
    rule = policy.orgs.get(identity.org_id) if identity.org_id is not None else None
    if rule is not None and rule.isolation is not None:
        return rule.isolation
    if is_per_session_org(policy.per_session_orgs, identity.org_id):
        return Isolation.PER_SESSION
    return Isolation.SHARED


def place(identity: Identity, policy: Policy) -> Placement:
    """Decide the sandbox ID, pool and isolation for an identity. Pure and deterministic."""
    isolation = isolation_for(identity, policy)
    if isolation is Isolation.PER_SESSION:
        sandbox_id = per_session_sandbox_id(identity.session_id)
    else:
        sandbox_id = shared_sandbox_id(identity.org_id, identity.user_id, identity.bot_id)
    rule = policy.orgs.get(identity.org_id) if identity.org_id is not None else None
    if rule is not None and rule.pool is not None:
        pool = rule.pool
    else:
        # A generated ID's prefix is its first three characters; no need to re-validate it.
        pool = policy.prefix_pools.get(sandbox_id[:3], policy.default_pool)
    return Placement(sandbox_id, pool, isolation)
