"""What the reaper does with one sandbox, and with an object no sandbox record knows.

Decided here, from values alone (the record's state and last activity, its pool, the time);
``gateway.lifecycle`` carries the decision out and checks what only I/O can tell (a stream open
on some replica, a record changed since the page was read). A sandbox of a pool no longer in the
policy is never reaped on a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from routing.policy import PoolSpec


class Act(Enum):
    KEEP = "keep"
    SUSPEND = "suspend"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Verdict:
    """``act`` on a sandbox for ``reason`` (``idle`` or ``retention``), provided it was not active
    at or after ``before``: the reaper's view may be stale, and the store's compare-and-set (or a
    fresh read) is judged against this cutoff."""

    act: Act
    reason: str = ""
    before: float = 0.0


KEEP = Verdict(Act.KEEP)


def reap_verdict(state: str, last_active: float, pool: PoolSpec | None, now: float, *,
                 activity_grace: float, can_suspend: bool) -> Verdict:
    """The verdict on a sandbox in ``state`` (a ``SandboxState`` value) last active at ``last_active``.

    A ready sandbox idle past its pool's ``idle_timeout``, and at least ``activity_grace`` (a
    request younger than that is known only by its start), is suspended when its pool says
    ``on_idle: suspend`` and its provider can, else deleted. A suspended one idle past the pool's
    ``retention`` (its last activity is its suspend) is deleted. Anything else is kept."""
    if pool is None:
        return KEEP
    if state == "ready":
        idle_before = now - max(pool.idle_timeout, activity_grace)
        if last_active >= idle_before:
            return KEEP
        act = Act.SUSPEND if pool.on_idle == "suspend" and can_suspend else Act.DELETE
        return Verdict(act, "idle", idle_before)
    if state == "suspended":
        kept_before = now - pool.retention
        if last_active >= kept_before:
            return KEEP
        return Verdict(Act.DELETE, "retention", kept_before)
    return KEEP


def orphaned(known: bool, created_at: float, now: float, grace: float) -> bool:
    """Whether a provider object is an orphan to delete: no record in the store knows it, and it is
    older than ``grace`` (a creation in flight on another replica has not written its record yet)."""
    return not known and created_at < now - grace
