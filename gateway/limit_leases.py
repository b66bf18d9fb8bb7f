"""Per-org limits for the whole installation: tokens and stream slots leased from Redis in batches.

``org_rate_limit``/``org_rate_burst`` and ``max_streams_per_org`` are the installation's when the
store is Redis (``org_limits_scope: installation``, the default): N replicas admit the configured
rate and streams between them, not N times them. The hot path stays a dict look-up: a replica
admits from what it holds, and takes more in the background (:mod:`gateway.store.redis_limits`),
one round trip per batch, not per request.

Tokens: the installation has one bucket per org (refilled at the rate, up to the burst, by the
Redis server's clock). A replica takes a batch (``BATCH_SECONDS`` of the rate) when it runs below
half a batch; the batch doubles while the bucket still holds tokens after one (round trips slower
than the refill must not let the bucket fill to its burst and drop the rest) and halves back when one
comes back short; a leased token unspent after ``TOKEN_LEASE`` is dropped (a replica cannot hoard a
past second's tokens), so a replica that dies takes at most its last batch with it (never more than
the burst). A replica that holds
none yet (a new org, or one just refilled) admits up to one batch on credit while the bucket last
had tokens, and repays the credit from its next batches: the bucket never goes below empty, so
over any window the installation admits at most the burst plus the rate times the window plus one
batch per replica (3 replicas at 100/s: 15 requests), and a refused client is told when to retry.

Stream slots: a replica holds as many of the org's ``max_streams_per_org`` slots as it has streams
open, plus one spare while there is room for every holder's spare; it renews what it holds every
third of ``SLOT_LEASE``, gives back what it no longer needs, and a replica killed with slots frees
them when its lease runs out (``SLOT_LEASE``). A stream beyond what a replica holds is admitted on
credit only while the installation has room for one per holder, so near the cap a replica may
refuse a stream that a spare elsewhere could have taken (the client retries), and never admits
more than the cap plus a race of at most one per replica.

Redis unreachable: each replica falls back to its own per-replica limits (:class:`OrgLimits`) for
``DEGRADED_FOR`` seconds at a time, as the installation did before, rather than refusing everyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

from gateway.errors import CapacityExceeded, StoreUnavailable
from gateway.limits import OrgLimits

__all__ = ["LimitLedger", "SharedOrgLimits"]

log = logging.getLogger(__name__)

BATCH_SECONDS = 0.05   # a batch of tokens is this much of a second's rate
TOKEN_LEASE = 1.0      # seconds a leased token may wait to be spent
SLOT_LEASE = 10.0      # seconds a replica's stream slots outlive its last renewal
DEGRADED_FOR = 5.0     # seconds of per-replica limits after Redis could not be reached
_MAX_TRACKED = 100_000


class LimitLedger(Protocol):
    """The shared side (``gateway.store.redis_limits.RedisLimitLedger``); raises ``StoreUnavailable``."""

    async def take_tokens(self, key: str, rate: float, burst: float, want: int) -> tuple[int, float]: ...

    async def hold_slots(self, key: str, want: int, used: int, cap: int, lease: float) -> tuple[int, int, int]: ...


class _Tokens:
    __slots__ = ("tokens", "expires", "fetching", "scarce", "not_before", "size")

    def __init__(self) -> None:
        self.tokens = 0.0       # held here; below zero: admitted on credit, repaid by the next batches
        self.expires = 0.0      # when held tokens are dropped unspent
        self.fetching = False
        self.scarce = False     # the last batch came back short: no credit until one does not
        self.not_before = 0.0   # after a short batch, when the bucket has refilled what was missing
        self.size = 0           # this replica's batch: doubled while the bucket keeps a backlog, halved when short


class _Slots:
    __slots__ = ("held", "used", "room", "holders", "syncing", "dirty", "need")

    def __init__(self) -> None:
        self.held = 0       # slots this replica holds in Redis
        self.used = 0       # streams open here
        self.room = 0       # the installation's free slots, as of the last sync
        self.holders = 0    # replicas holding slots, as of the last sync (0: never synced)
        self.syncing = False
        self.dirty = False  # changed while a sync was in flight: sync again
        self.need = False   # a stream was refused here: ask for one more slot than is open


class SharedOrgLimits:
    """``OrgLimits``'s interface (admit, open_stream, close_stream), counted for the installation."""

    def __init__(self, ledger: LimitLedger, *, rate: float | None = None, burst: int | None = None,
                 max_streams: int | None = None, clock: Callable[[], float] = time.monotonic,
                 token_lease: float = TOKEN_LEASE, slot_lease: float = SLOT_LEASE) -> None:
        self._ledger = ledger
        self._local = OrgLimits(rate=rate, burst=burst, max_streams=max_streams, clock=clock)
        self._rate = rate
        self._burst = float(burst if burst is not None else max(1, math.ceil(rate or 1)))
        self._batch = max(1, min(int(self._burst), math.ceil((rate or 0) * BATCH_SECONDS)))
        self._max_streams = max_streams
        self._clock = clock
        self._token_lease = token_lease
        self._slot_lease = slot_lease
        self._tokens: dict[str, _Tokens] = {}
        self._slots: dict[str, _Slots] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._degraded_until = 0.0
        self._closed = False

    @property
    def active(self) -> bool:
        return self._rate is not None or self._max_streams is not None

    @property
    def caps_streams(self) -> bool:
        return self._max_streams is not None

    def open_streams(self, key: str) -> int:
        slots = self._slots.get(key)
        return 0 if slots is None else slots.used

    # requests ---------------------------------------------------------------
    def admit(self, key: str) -> None:
        """Take one of the installation's request tokens for ``key`` or raise ``CapacityExceeded``."""
        rate = self._rate
        if rate is None:
            return
        now = self._clock()
        if now < self._degraded_until:
            self._local.admit(key)
            return
        bucket = self._tokens.pop(key, None)
        if bucket is None:
            bucket = _Tokens()
            if len(self._tokens) >= _MAX_TRACKED:
                self._tokens.pop(next(iter(self._tokens)))
        self._tokens[key] = bucket  # (re-)inserted last: dict order is recency
        if bucket.tokens > 0 and now > bucket.expires:
            bucket.tokens = 0.0  # a lease unspent too long: dropped
        if bucket.tokens >= 1 or (not bucket.scarce and bucket.tokens > -self._batch):
            bucket.tokens -= 1
            if bucket.tokens < self._batch / 2:
                self._fetch(key, bucket, now)
            return
        self._fetch(key, bucket, now)
        raise CapacityExceeded(
            f"request rate limit for {key!r} reached ({rate:g}/s, burst {self._burst:g}, for the whole "
            "installation); slow down", scope="org_rate",
            retry_after=max(1.0 / rate, bucket.not_before - now, -bucket.tokens / rate))

    def _fetch(self, key: str, bucket: _Tokens, now: float) -> None:
        if bucket.fetching or now < bucket.not_before or self._closed:
            return
        bucket.fetching = True
        self._spawn(self._take(key, bucket))

    async def _take(self, key: str, bucket: _Tokens) -> None:
        assert self._rate is not None
        # A batch and the credit to repay. The batch adapts: a replica whose round trips are slower than
        # its share of the refill (a starved loop, a far Redis) would otherwise take one small batch per
        # round trip while the bucket fills to its burst and drops the rest, and the installation admit
        # less than its rate. Whatever a replica takes came out of the one bucket, so the bound in the
        # module's docstring holds.
        size = max(self._batch, bucket.size)
        want = size + max(0, math.ceil(-bucket.tokens))
        try:
            granted, left = await self._ledger.take_tokens(key, self._rate, self._burst, want)
        except StoreUnavailable as exc:
            self._degrade(exc)
            return
        finally:
            bucket.fetching = False
        now = self._clock()
        if bucket.tokens > 0 and now > bucket.expires:
            bucket.tokens = 0.0
        bucket.tokens += granted
        if left >= 1:
            bucket.size = min(int(self._burst), size * 2)  # the bucket outpaces this replica's batches
        elif granted < want:
            bucket.size = max(self._batch, size // 2)
        bucket.expires = now + self._token_lease
        bucket.scarce = granted < want
        bucket.not_before = now + (want - granted) / self._rate if bucket.scarce else 0.0

    # streams ----------------------------------------------------------------
    def open_stream(self, key: str, *, force: bool = False) -> None:
        """Count a new stream for ``key`` or raise ``CapacityExceeded`` (``force``: count it anyway)."""
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = _Slots()
        cap = self._max_streams
        if cap is not None and not force and slots.used >= slots.held and not self._credit(slots, cap):
            slots.need = True
            self._sync(key, slots)
            raise CapacityExceeded(
                f"{key!r} already has {cap - max(0, slots.room)} open streams across the installation "
                f"(max_streams_per_org {cap}); close one first", scope="org_streams", retry_after=1.0)
        slots.used += 1
        if cap is not None and slots.used >= slots.held:
            self._sync(key, slots)  # take this stream's slot (and a spare) before the next one

    def _credit(self, slots: _Slots, cap: int) -> bool:
        if self._clock() < self._degraded_until:
            return slots.used < cap  # Redis unreachable: the per-replica cap
        return slots.used == slots.held and (slots.holders == 0 or slots.room >= slots.holders)

    def close_stream(self, key: str) -> None:
        slots = self._slots.get(key)
        if slots is None:
            return
        slots.used = max(0, slots.used - 1)
        if self._max_streams is None:
            if slots.used == 0:
                del self._slots[key]
        elif slots.held > slots.used + 1 or slots.used == 0:
            self._sync(key, slots)  # give back what is no longer needed

    def _sync(self, key: str, slots: _Slots) -> None:
        if slots.syncing:
            slots.dirty = True
        elif not self._closed:
            slots.syncing = True
            self._spawn(self._hold(key, slots))
        if self._renewer is None and not self._closed:
            self._renewer = asyncio.get_running_loop().create_task(self._renew(), name="org-limit-slots")

    async def _hold(self, key: str, slots: _Slots) -> None:
        assert self._max_streams is not None
        try:
            while True:
                slots.dirty = False
                spare = 1 if slots.need or slots.holders == 0 or slots.room > slots.holders else 0
                slots.held, slots.room, slots.holders = await self._ledger.hold_slots(
                    key, slots.used + spare, slots.used, self._max_streams, self._slot_lease)
                slots.need = False
                if not slots.dirty:
                    break
        except StoreUnavailable as exc:
            self._degrade(exc)
        finally:
            slots.syncing = False
        if slots.used == 0 and slots.held == 0 and self._slots.get(key) is slots:
            del self._slots[key]

    async def _renew(self) -> None:
        """Renew every held slot before its lease runs out (a third of the way)."""
        while not self._closed:
            await asyncio.sleep(self._slot_lease / 3)
            for key, slots in list(self._slots.items()):
                if slots.held > 0 and not slots.syncing:
                    slots.syncing = True
                    await self._hold(key, slots)

    # background -------------------------------------------------------------
    def _spawn(self, job: object) -> None:
        task = asyncio.get_running_loop().create_task(job)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _degrade(self, exc: StoreUnavailable) -> None:
        if self._clock() >= self._degraded_until:
            log.warning("org limits: %s; per-replica limits for %gs", exc.message, DEGRADED_FOR)
        self._degraded_until = self._clock() + DEGRADED_FOR

    async def close(self) -> None:
        """Stop taking leases and give this replica's stream slots back (bounded: else they expire)."""
        self._closed = True
        pending = set(self._tasks) | ({self._renewer} if self._renewer is not None else set())
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        if self._max_streams is None:
            return
        with contextlib.suppress(StoreUnavailable, TimeoutError):
            async with asyncio.timeout(1.0):
                for key, slots in list(self._slots.items()):
                    if slots.held > 0:
                        await self._ledger.hold_slots(key, 0, 0, self._max_streams, 0)
