"""One reaper pass over what is due, in batches sized by the backlog (``Lifecycle.reap_once`` runs it).

For each pool of the policy, the pass reads the due records straight from the store's
state-and-pool indexes: ready sandboxes idle past the pool's cutoff (its ``idle_timeout``, at
least ``activity_grace``), suspended ones past its ``retention``, and deletes whose reaper died
(their lease lapsed). Everything read is due, so a fleet with nothing due costs one short read per
pool and state, and a backlog is worked through at the provider's and the store's pace, not a
fixed number per interval. Suspends whose holder died (a replica killed mid-suspend) are done
again, as deletes are. Each chunk of ``reap_concurrency`` sandboxes is

1. claimed in one store call (``claim_due``): a compare-and-set on the state and activity the
   verdict saw, moving each to ``suspending`` or ``deleting`` under a lease (every replica drops
   its route; a request for it waits, then wakes or re-creates it);
2. suspended or deleted at the provider, all at once, each under its renewed lease;
3. settled in one store call (``finish_due``), which also drops a deleted per-session sandbox's
   own binding.

The pass goes on while batches come back full, within ``reap_budget`` seconds and while this
replica keeps the reaper lease; its rate is reported (``sgw_reap_rate``). A delete that fails at
the provider stays ``deleting`` until its lease lapses, and a later pass (or a request, which
re-creates the sandbox) takes it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import GatewayError
from gateway.model import Position, SandboxFilter, SandboxRecord, SandboxState
from gateway.providers.base import SandboxProvider
from gateway.store.base import Claim, Due, SessionStore
from routing.reaping import Act, reap_verdict

if TYPE_CHECKING:
    from gateway.router_base import RouterEvents, RouterTuning
    from routing.policy import PoolSpec

log = logging.getLogger(__name__)

# Index entries one backfill call lists: each call holds Redis for ~6 us an entry. Until every record
# of an earlier version is indexed, 2,000 at a time, calls after calls within the pass's budget; after,
# a page a pass, only while a replica of that version writes around the indexes (a rolling upgrade: the
# store sees it), else none (the store's check is one digest of its counts).
BACKFILL_BATCH = 2_000

Renewing = Callable[[SandboxRecord, float], contextlib.AbstractAsyncContextManager[None]]


@dataclass(frozen=True, slots=True)
class _Act:
    """What to do with the records of one index of a pool (ready, suspended; deleting or suspending: lapsed)."""

    state: SandboxState
    before: float
    to: SandboxState
    reason: str


@dataclass
class ReapPass:
    """One pass (see the module docstring); ``now`` is the verdict's time."""

    store: SessionStore
    provider: SandboxProvider
    events: RouterEvents
    tuning: RouterTuning
    now: float
    lease_for: Callable[[str], float]
    renewing: Renewing
    keep_lease: Callable[[], Awaitable[bool]]
    clock: Callable[[], float]
    acted: int = 0

    async def run(self, pools: Mapping[str, PoolSpec]) -> list[str]:
        """Work through what is due in ``pools``; the IDs deleted (suspended ones are counted, not returned)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deleted: list[str] = []
        # Records of an earlier version: all of them before a pass reads the indexes, then a page a pass
        # while such a version still writes.
        indexed = await self.store.backfill_indexes(BACKFILL_BATCH)
        while not indexed:
            if loop.time() - started >= self.tuning.reap_budget:
                return deleted
            indexed = await self.store.backfill_indexes(BACKFILL_BATCH)
        try:
            for name in sorted(pools):
                for act in self._acts(name, pools[name]):
                    after: Position | None = None  # entries acted on leave the index; the rest are passed
                    while True:
                        page = await self.store.scan_sandboxes(
                            after, limit=self.tuning.reap_batch, scan=self.tuning.reap_batch, before=act.before,
                            where=SandboxFilter(pool=name, state=act.state))
                        records = page.records
                        if act.state is act.to:
                            records = [r for r in records if r.lease_until < self.now]  # its holder died
                        for start in range(0, len(records), self.tuning.reap_concurrency):
                            chunk = records[start:start + self.tuning.reap_concurrency]
                            await self._chunk(name, act, chunk, deleted)
                        after = page.next
                        if after is None:
                            break
                        if loop.time() - started >= self.tuning.reap_budget or not await self.keep_lease():
                            return deleted  # the next pass (or the lease's next holder) goes on
        finally:
            if self.acted:
                self.events.reap_pass(self.acted, loop.time() - started)
        return deleted

    def _acts(self, name: str, pool: PoolSpec) -> list[_Act]:
        """The indexes of ``pool`` to read, and up to when: the pure verdict (``routing.reaping``) on a
        record of each state idle since ever gives the cutoff (and what to do) for the whole index."""
        acts = []
        for state in (SandboxState.READY, SandboxState.SUSPENDED):
            verdict = reap_verdict(state.value, -math.inf, pool, self.now, activity_grace=self.tuning.activity_grace,
                                   can_suspend=self.provider.can_suspend(name))
            if verdict.act is not Act.KEEP:
                to = SandboxState.SUSPENDING if verdict.act is Act.SUSPEND else SandboxState.DELETING
                acts.append(_Act(state, verdict.before, to, verdict.reason))
        # A delete or suspend whose holder died (its lease lapsed) is done again: nothing else would finish it.
        return [*acts, _Act(SandboxState.DELETING, math.inf, SandboxState.DELETING, "idle"),
                _Act(SandboxState.SUSPENDING, math.inf, SandboxState.SUSPENDING, "idle")]

    async def _chunk(self, pool: str, act: _Act, records: list[SandboxRecord], deleted: list[str]) -> None:
        """Claim, act on and settle one chunk."""
        token = uuid.uuid4().hex[:12]
        lease = self.lease_for(pool)
        lease_until = self.clock() + lease
        due = [Due(r.sandbox_id, act.state, act.before, act.to) for r in records]
        claims = await self.store.claim_due(due, lease_until, token)
        busy = [one for one, claim in zip(due, claims, strict=True) if claim is Claim.BUSY]
        if busy:
            claims = await self._recheck_streams(busy, claims, due, lease_until, token)
        claimed = [r for r, claim in zip(records, claims, strict=True) if claim is Claim.CLAIMED]
        outcomes = await asyncio.gather(*(self._act(r, act.to, lease, lease_until) for r in claimed))
        done = [r.sandbox_id for r, ok in zip(claimed, outcomes, strict=True) if ok]
        suspending = act.to is SandboxState.SUSPENDING
        still_bound = await self.store.finish_due(done if suspending else [], [] if suspending else done, token)
        for sandbox_id in still_bound:  # sessions bound besides its own (not folded into the record)
            if sandbox_id.startswith("ses-"):
                for session_id in await self.store.sessions_of(sandbox_id):
                    await self.store.delete_binding(session_id)
        if not suspending:
            for _ in done:
                self.events.reaped(act.reason)
            deleted += done
        self.acted += len(done)
        if done:
            log.info("reaper: %s %d sandbox(es) of pool %s (%s)", "suspended" if suspending else "deleted",
                     len(done), pool, act.reason)

    async def _recheck_streams(self, busy: list[Due], claims: list[Claim], due: list[Due], lease_until: float,
                               token: str) -> list[Claim]:
        """Streams are recorded for these: the ones whose streams are open on a live replica are kept
        (and their activity moves on, out of the index's due range); the rest (a dead replica's
        counts) are claimed without that check."""
        quiet = []
        for one in busy:
            if await self.store.open_streams(one.sandbox_id) > 0:
                await self.store.touch({one.sandbox_id: self.now}, {})
            else:
                quiet.append(Due(one.sandbox_id, one.state, one.before, one.to, check_streams=False))
        again = dict(zip((one.sandbox_id for one in quiet),
                         await self.store.claim_due(quiet, lease_until, token), strict=True))
        return [again.get(one.sandbox_id, claim) if claim is Claim.BUSY else claim
                for one, claim in zip(due, claims, strict=True)]

    async def _act(self, record: SandboxRecord, to: SandboxState, lease: float, lease_until: float) -> bool:
        """Suspend or delete one claimed sandbox at its provider; False when a delete failed (it stays
        ``deleting``, and is taken over once its lease lapses). A suspend that failed is recorded
        as suspended all the same, as ``Lifecycle.suspend`` does: its next request resumes it."""
        sandbox_id, pool = record.sandbox_id, record.pool
        try:
            async with self.renewing(record.with_(lease_until=lease_until), lease):
                if to is SandboxState.SUSPENDING:
                    await self.provider.suspend(sandbox_id, pool)
                else:
                    await self.provider.delete(sandbox_id, pool)
        except Exception as exc:
            if to is SandboxState.SUSPENDING:
                log.warning("suspending sandbox %s failed (%s); it is woken by its next request", sandbox_id, exc)
                self.events.suspended(pool, exc.code if isinstance(exc, GatewayError) else "error")
                return True
            log.warning("deleting sandbox %s failed (%s); tried again once its lease lapses", sandbox_id, exc)
            return False
        if to is SandboxState.SUSPENDING:
            self.events.suspended(pool, "suspended")
        return True
