"""The fleet half of :class:`~gateway.store.redis.RedisStore`: listing, activity, counts and the reaper's batches.

What reads or changes many sandboxes at once lives here, each a bounded number of round trips
whatever the fleet size:

- **Listing** pages through a zset by (last activity, ID): ``idx`` for everything, or the
  state-and-pool indexes ``ix:<state>:<pool>`` for a listing filtered by state or pool (merged in
  one script, ``INDEX_PAGE``), so a filtered page reads only matching entries, however rare. The
  scripts that change a record's state move its entry (``restate`` in ``redis_scripts``), and
  ``touch`` moves its score with ``idx``'s: they cannot drift. The cost: a second zset entry per
  sandbox (~150 B with ``idx``'s 150 B, see ``gateway.store.redis``'s footprint).
- **Reaping** reads a pool's due records straight from its ``ix:ready:<pool>`` or
  ``ix:suspended:<pool>`` index (only entries older than that pool's cutoff: nothing read is wasted),
  claims a whole batch in one script (``CLAIM_DUE``: the state and activity the verdict saw, a
  compare-and-set) and settles it in another (``FINISH_DUE``), instead of four to six round trips
  per sandbox.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from gateway.model import Position, SandboxFilter, SandboxRecord, SandboxState
from gateway.store import redis_codec as codec
from gateway.store.base import ANY_SANDBOX, Claim, Due, FleetCounts, SandboxPage
from gateway.store.redis_errors import translated
from gateway.store.redis_listener import RedisListener
from gateway.store.redis_fleet_scripts import (
    BACKFILL_INDEXES, CLAIM_DUE, FINISH_DUE, INDEX_PAGE, READ_MATCHING, READ_RECORDS, TOUCH,
)
from gateway.store.redis_scripts import RedisKeys

_LISTING_BACKFILL = 500  # index entries a filtered listing lists while the backfill is not done

_CLAIMS = {1: Claim.CLAIMED, 0: Claim.CHANGED, 2: Claim.BUSY}


class RedisFleet:
    """Listing, activity, counts and reaper batches; mixed into ``RedisStore`` (which sets up the client,
    the keys, the clock and the listener these use)."""

    keys: RedisKeys
    _redis: Redis
    _clock: Callable[[], float]
    _listener: RedisListener
    _origin: str
    _streams_lock: asyncio.Lock
    _forget_streams: Callable[[str], None]

    def _register_fleet_scripts(self) -> None:
        self._index_page = self._redis.register_script(INDEX_PAGE)
        self._read_records = self._redis.register_script(READ_RECORDS)
        self._read_matching = self._redis.register_script(READ_MATCHING)
        self._touch = self._redis.register_script(TOUCH)
        self._claim_due = self._redis.register_script(CLAIM_DUE)
        self._finish_due = self._redis.register_script(FINISH_DUE)
        self._backfill = self._redis.register_script(BACKFILL_INDEXES)
        self._indexed = False  # every record is in its state-and-pool index (seen once: stays so)

    # listing ---------------------------------------------------------------
    @translated("list sandboxes")
    async def scan_sandboxes(self, after: Position | None, *, limit: int, scan: int,
                             before: float = math.inf, where: SandboxFilter = ANY_SANDBOX) -> SandboxPage:
        keys = await self._indexes_for(where)
        if not keys:
            return SandboxPage([], None)
        if keys != [self.keys.sandboxes] and where.org_id is None:
            scan = min(scan, limit)  # every entry of these indexes matches: read no more than a page
        flat = await self._index_page(
            keys=keys,
            args=["" if after is None else codec.num(after.last_active), "" if after is None else after.sandbox_id,
                  codec.num(before), scan])
        entries = [Position(float(flat[i + 1]), flat[i]) for i in range(0, len(flat), 2)]
        more = len(entries) > scan
        entries = entries[:scan]
        if where.org_id is not None or (not where.any and keys == [self.keys.sandboxes]):
            return await self._scan_matching(entries, more, limit, where)
        by_id = {r.sandbox_id: r for r in await self._read_many(entries)}
        found: list[SandboxRecord] = []
        for index, entry in enumerate(entries):
            record = by_id.get(entry.sandbox_id)  # released (or moved on) between the two reads: skipped
            if record is not None and where.matches(record):
                found.append(record)
                if len(found) == limit:
                    more = more or index + 1 < len(entries)
                    entries = entries[:index + 1]
                    break
        return SandboxPage(found, entries[-1] if more and entries else None)

    async def _indexes_for(self, where: SandboxFilter) -> list[str]:
        """The zsets a scan reads: ``idx``, or the state-and-pool indexes the filter names (those of
        ``count:state``'s non-empty pairs where the filter leaves the state or the pool open). Until the
        backfill is done (records of an earlier version), ``idx``: the filter then runs in Redis."""
        if where.state is None and where.pool is None or not await self._is_indexed():
            return [self.keys.sandboxes]
        if where.state is not None and where.pool is not None:
            return [self.keys.state_index(where.state.value, where.pool)]
        pairs = [name.partition(":") for name in await self._redis.hkeys(self.keys.count_state)]
        return sorted(self.keys.state_index(state, pool) for state, _, pool in pairs
                      if where.state in (None, state) and where.pool in (None, pool))

    async def _scan_matching(self, entries: list[Position], more: bool, limit: int,
                             where: SandboxFilter) -> SandboxPage:
        """A page filtered by org: the filter runs in Redis (READ_MATCHING), so only the matches cross the
        wire and are decoded, not every record examined."""
        if not entries:
            return SandboxPage([], None)
        reply = await self._read_matching(
            keys=[self.keys.sandbox(entry.sandbox_id) for entry in entries],
            args=[where.state.value if where.state is not None else "", where.pool or "", where.org_id or "", limit])
        examined, found = int(reply[0]), []
        for i in range(1, len(reply), 2):
            entry = entries[int(reply[i]) - 1]
            found.append(codec.record_of(entry.sandbox_id, [*reply[i + 1], codec.num(entry.last_active)])[0])
        more = more or examined < len(entries)
        return SandboxPage(found, entries[examined - 1] if more and examined else None)

    async def _read_many(self, entries: list[Position]) -> list[SandboxRecord]:
        """The records of index entries, in one script call (the index gave the last activity
        already); a record released in between is left out."""
        if not entries:
            return []
        fields = await self._read_records(keys=[self.keys.sandbox(entry.sandbox_id) for entry in entries])
        return [codec.record_of(entry.sandbox_id, [*view, codec.num(entry.last_active)])[0]
                for entry, view in zip(entries, fields, strict=True) if view[0] is not None]

    @translated("look up sandboxes")
    async def existing_sandboxes(self, sandbox_ids: Sequence[str]) -> set[str]:
        if not sandbox_ids:
            return set()
        async with self._redis.pipeline(transaction=False) as pipe:
            for sandbox_id in sandbox_ids:
                pipe.exists(self.keys.sandbox(sandbox_id))
            found = await pipe.execute()
        return {sandbox_id for sandbox_id, exists in zip(sandbox_ids, found, strict=True) if exists}

    @translated("count sandboxes")
    async def fleet_counts(self) -> FleetCounts:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.count_state)
            pipe.hgetall(self.keys.count_sessions)
            by_state, by_pool = await pipe.execute()
        sandboxes: dict[tuple[str, SandboxState], int] = {}
        for name, count in by_state.items():
            state, _, pool = name.partition(":")
            if state in SandboxState.__members__.values() and int(count) > 0:
                sandboxes[pool, SandboxState(state)] = int(count)
        return FleetCounts(sandboxes, {pool: int(n) for pool, n in by_pool.items() if int(n) > 0})

    async def _is_indexed(self) -> bool:
        """Whether every record is in its state-and-pool index; until then a listing does a bounded
        share of the backfill itself (a new installation is done at its first call: idx is empty)."""
        if not self._indexed:
            await self.backfill_indexes(_LISTING_BACKFILL)
        return self._indexed

    @translated("index sandboxes")
    async def backfill_indexes(self, limit: int) -> bool:
        # Once done, a call sweeps a page only while a replica of the earlier version writes around the
        # indexes (a rolling upgrade: the script sees the counts drift from the indexes); else one digest.
        self._indexed = bool(await self._backfill(keys=[self.keys.sandboxes, self.keys.indexed, self.keys.sweep,
                                                        self.keys.count_state], args=["", "", limit]))
        return self._indexed

    # activity --------------------------------------------------------------
    @translated("record activity")
    async def touch(self, sandboxes: Mapping[str, float], sessions: Mapping[str, float]) -> None:
        if not sandboxes and not sessions:
            return
        args: list[Any] = [len(sandboxes)]
        for sandbox_id, at in sandboxes.items():
            args += [sandbox_id, codec.num(at)]
        for session_id, at in sessions.items():
            args += [session_id, codec.num(at)]
        await self._touch(keys=[self.keys.sandboxes, self.keys.session_seen,
                                *(self.keys.sandbox(sandbox_id) for sandbox_id in sandboxes)], args=args)

    # reaping ---------------------------------------------------------------
    @translated("claim sandboxes to reap")
    async def claim_due(self, due: Sequence[Due], lease_until: float, token: str) -> list[Claim]:
        if not due:
            return []
        keys = [self.keys.sandboxes, self.keys.count_pool, self.keys.count_org, self.keys.count_state]
        args: list[Any] = [codec.num(self._clock()), codec.num(lease_until), token, self.keys.invalidate, self._origin]
        for one in due:
            keys += [self.keys.sandbox(one.sandbox_id), self.keys.streams(one.sandbox_id)]
            args += [one.sandbox_id, one.state.value, codec.num(one.before), one.to.value,
                     "1" if one.check_streams else "0"]
        claims = [_CLAIMS[int(code)] for code in await self._claim_due(keys=keys, args=args)]
        for one, claim in zip(due, claims, strict=True):
            if claim is Claim.CLAIMED:
                self._listener.notify(one.sandbox_id)
        return claims

    @translated("settle reaped sandboxes")
    async def finish_due(self, suspended: Sequence[str], deleted: Sequence[str], token: str) -> list[str]:
        if not suspended and not deleted:
            return []
        keys = [self.keys.sandboxes, self.keys.count_pool, self.keys.count_org, self.keys.count_state,
                self.keys.session_seen, self.keys.count_sessions]
        args: list[Any] = [codec.num(self._clock()), token, self.keys.settled, self.keys.invalidate, self._origin]
        done = [(sandbox_id, "s") for sandbox_id in suspended] + [(sandbox_id, "d") for sandbox_id in deleted]
        for sandbox_id, kind in done:
            keys += [self.keys.sandbox(sandbox_id), self.keys.streams(sandbox_id)]
            args += [sandbox_id, kind]
        async with self._streams_lock:  # a stream count in flight must not land after the record went
            reply = await self._finish_due(keys=keys, args=args)
        still_bound = []
        for i, (sandbox_id, kind) in enumerate(done):
            outcome, folded = int(reply[2 * i]), reply[2 * i + 1]
            if outcome:
                self._listener.notify(sandbox_id)
                if kind == "d":
                    self._forget_streams(sandbox_id)
            if folded:
                self._listener.notify(folded)
            if outcome == 2:
                still_bound.append(sandbox_id)
        return still_bound
