"""Pure routing decisions: identity, sandbox IDs, policy, placement, hashing.

Nothing in this package does I/O or touches asyncio: every function takes values
and returns values, so the decisions can be tested exhaustively and run on the
data plane's hot path without awaiting anything.
"""

from routing.identity import Identity, InvalidIdentity
from routing.ids import (
    is_valid_sandbox_id,
    parse_org_list,
    per_session_sandbox_id,
    sandbox_id_prefix,
    shared_sandbox_id,
)
from routing.placement import Placement, place, pool_for
from routing.policy import Isolation
from routing.policy import OrgRule, Policy, PolicyError, PoolSpec, default_policy, parse_policy
from routing.rendezvous import RendezvousRing

__all__ = [
    "Identity",
    "InvalidIdentity",
    "Isolation",
    "OrgRule",
    "Placement",
    "Policy",
    "PolicyError",
    "PoolSpec",
    "RendezvousRing",
    "default_policy",
    "is_valid_sandbox_id",
    "parse_org_list",
    "parse_policy",
    "per_session_sandbox_id",
    "place",
    "pool_for",
    "sandbox_id_prefix",
    "shared_sandbox_id",
]
