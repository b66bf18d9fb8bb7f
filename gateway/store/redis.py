"""The shared store: any number of gateway replicas, one session map, in Redis.

Every method is one atomic step on the server (a Lua script from
:mod:`gateway.store.redis_scripts`, a MULTI, or a single command), so a
binding lands with its indexes or not at all, and two replicas reserving the
same sandbox can never both create it.

Keys (``P`` is the installation's prefix; the braces make it the Redis Cluster
hash tag, so every key of one installation lives in one slot and every script
is cluster-safe)::

    key                        type    TTL            contents
    {P}:b:<session_id>         string  none           the binding, compact (redis_codec.binding_value): pool,
                                                      s|h, created ms, org, user[, bot[, sandbox ID]] joined by
                                                      \x1f, UUIDs in 23 chars; the sandbox ID only where the
                                                      binding does not derive it (JSON, as earlier versions
                                                      wrote, where a field cannot be text; both are read).
                                                      None for a session bound to its own per-session sandbox:
                                                      that binding is folded into the sandbox's hash
    {P}:seen                   zset    none           session_id -> last seen (idle_sessions, oldest first); a
                                                      folded binding is here only while its sandbox has no record
    {P}:s:<sandbox_id>         hash    none           the record (one-letter fields, see redis_scripts; the
                                                      owner in u, b, v, UUIDs packed as in bindings; c in whole
                                                      seconds, an integer) and one "+<session_id>" field per bound
                                                      session with their count n: no per-sandbox set. A per-session
                                                      sandbox's own session's binding is folded in: "+<session_id>"
                                                      holds its head (pool, s, created ms), "=" its owner. A
                                                      listpack for ordinary IDs (every value <= 64 bytes)
    {P}:idx                    zset    none           sandbox_id -> last_active, one entry per record: the
                                                      index that listing pages through
                                                      (scan_sandboxes: INDEX_PAGE, bounded per call)
    {P}:ix:<state>:<pool>      zset    none           sandbox_id -> last_active, the records in that state
                                                      of that pool: filtered listings and the reaper
                                                      (gateway.store.redis_fleet)
    {P}:indexed                string  none           "p <cursor>" while records of a version before ix: are
                                                      listed in them, then "d" ("d <cursor>": a sweep round)
    {P}:sweep                  hash    none           sig, added: when the sweep runs again (the drift of the
                                                      counts from ix: that an older replica's writes cause)
    {P}:count:pool             hash    none           pool -> live (all but suspended) records (caps)
    {P}:count:org              hash    none           org_id -> live (all but suspended) records (caps)
    {P}:count:state            hash    none           "<state>:<pool>" -> live records (the gauges)
    {P}:count:sessions         hash    none           pool -> bindings (the gauges)
    {P}:streams:<sandbox_id>   hash    none (deleted  replica_id -> streams open on that replica
                                       on release)
    {P}:replica:<replica_id>   string  heartbeat_ttl  heartbeat (refreshed every heartbeat_interval);
                                                      while absent, that replica's streams don't count
    {P}:epoch                  string  none           when this data began (written by the first replica
                                                      to look after a reset): orphan grace counts from it
    {P}:lease:<name>           hash    lease ttl      holder, until (the clock's deadline; the lease ends
                                                      at the deadline or the TTL, whichever comes first)
    {P}:lim:rate:<org>         hash    burst/rate+1s  the org's request tokens for the installation (gateway.store.redis_limits)
    {P}:lim:streams:<org>      hash    2 x lease      replica process -> stream slots held and until when
    {P}:settled                channel                {"id", "gen", "state": "ready"|"removed"|"suspended", "error"}
    {P}:invalidate             channel                [origin, "session"|"sandbox", id]

Footprint (``benchmarks/footprint_bench.py``, Redis 7.0, sessions each bound to its own ready
sandbox, UUID org and user, a pod-IP endpoint): 756 B of ``used_memory`` per session at 1,000,000
with the record's ``ix:<state>:<pool>`` entry (``benchmarks/fleet_bench.py``, issue 27); before it, 599 B
and 654 B at 10,000 (845 B and 907 B before the binding was folded in; 949 B and 1,028 B before the
text bindings and packed IDs). By ``MEMORY USAGE``: the sandbox hash 424 B (a listpack, the folded
binding included), its ``idx`` entry 150 B (a skiplist node: the member, the score, the dict entry),
the main dictionary ~25 B for its one key. A session of a shared sandbox still has its own binding
key (184 B) and ``seen`` entry (~140 B).

This layout (version 2) does not read the keys of versions before it (``binding:``, ``sandbox:``,
``sandbox-sessions:``): upgrading a live installation needs an empty Redis or a migration. Within
version 2, JSON bindings, plain owner IDs and per-session bindings under their own ``b:`` key (as
written before folding) still read, and such a binding keeps winning over a new put until deleted.

Background work is bounded whatever the fleet size: the gauges read ``count:state`` and
``count:sessions`` (kept by the same scripts that keep the caps), and reaping and listing read
one bounded page of ``idx`` at a time.

IDs are used verbatim (Redis keys are binary-safe) and always as the *last*
component of a key, and the fixed parts above are prefix-free (no fixed part is
a prefix of another, no fixed key starts with a variable one's fixed part): so
a session ID containing ``:`` (or anything else) can never name another key.
Org IDs appear only as hash fields, never in key names.

Ownership: a sandbox serves only its owner, and the owner is kept with the
sandbox, not only with the binding, because bindings can go while sandboxes
live (a Redis restarted without persistence, a shared sandbox's binding past
``session_ttl``). A record's ``owner`` (``u``, ``b`` and, where it differs from the
cap org ``o``, ``v``; written once at reservation) is checked by the router against every
binding that reaches the sandbox (``gateway.model.may_claim``); a record of an
older version has none and is claimed only on evidence (see ``may_claim``).

Times (``created_at``, ``lease_until``, ``last_active``, last seen, a named
lease's deadline) come from the injected ``clock``; TTLs (heartbeats, and named
leases as a backstop) are Redis's own.

Background work, started lazily from a running loop (nothing connects at
construction): one pub/sub listener per store (:class:`RedisListener`, in
:mod:`gateway.store.redis_listener`, on the first ``subscribe`` or
``wait_settled``), reconnecting by itself; one heartbeat task (on the first
``add_streams``). ``close()`` stops both and closes the client.

The class is in three parts: this module (bindings, records and their create-once protocol,
leases), :mod:`gateway.store.redis_fleet` (listing, activity, counts and the reaper's batches)
and :mod:`gateway.store.redis_streams` (stream counts and the heartbeat).

``wait_settled`` subscribes before it reads the record (no lost wake-ups), then
waits for a ``settled`` message, waking also when the creator's lease expires:
it then returns ``Settled.ABANDONED`` with the stale record, which tells the
caller "nobody is creating this any more, reserve again" (``reserve_sandbox``
then takes the record over: ``Reserved.TAKEN_OVER``). After a pub/sub reconnect, waiters re-read the
record, since messages sent while disconnected are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from gateway.errors import StoreUnavailable
from gateway.model import Binding, Endpoint, SandboxRecord, SandboxState
from gateway.store import redis_scripts as lua
from gateway.store.base import (
    UNSETTLED_STATES, Caps, CapScope, Invalidation, LeaseLost, NotReserved, Released, Reservation, Reserved, Settled,
    Settlement, SettleTimeout,
)
from gateway.store import redis_codec as codec
from gateway.store.redis_connect import close_pool, connection_pool, healthy_replicas
from gateway.store.redis_errors import translated
from gateway.store.redis_pool import first
from gateway.store.redis_fleet import RedisFleet
from gateway.store.redis_streams import RedisStreamCounts
from gateway.store.redis_limits import RedisLimitLedger
from gateway.store.redis_listener import RedisListener
from gateway.store.redis_scripts import RedisKeys
from routing import per_session_sandbox_id

__all__ = ["RedisKeys", "RedisStore"]

log = logging.getLogger(__name__)

_ALONE_WAIT_MS = 10  # WAIT while the primary has no replica up: long enough for one that just came back


async def _read_again_on_timeout(script: Any, **call: Any) -> Any:
    """A read script, sent once more when the first answer did not come within the socket timeout.
    Writes are never re-sent (they may have run); a read may be: on a starved host (a hundred sandboxes
    waking on two cores) one late answer would otherwise fail a request the next round trip serves."""
    try:
        return await script(**call)
    except redis_errors.TimeoutError:
        return await script(**call)

class RedisStore(RedisFleet, RedisStreamCounts):
    """``SessionStore`` shared by every replica of one installation (``prefix``).

    ``replica_id`` must be unique per process: it owns this process's stream
    counts and heartbeat. Timeouts are small on purpose: a Redis that does not
    answer becomes ``StoreUnavailable`` (503) within seconds, and the client
    reconnects by itself when Redis is back.
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        replica_id: str,
        *,
        clock: Callable[[], float] = time.time,
        heartbeat_interval: float = 5.0,
        heartbeat_ttl: float = 15.0,
        recheck_interval: float = 5.0,
        socket_timeout: float = 2.0,
        connect_timeout: float = 1.0,
        retries: int = 3,
        max_connections: int = 64,
        pool_timeout: float = 10.0,
        health_check_interval: int = 15,
        replica_acks: int = 0,
        replica_ack_timeout: float = 1.0,
    ) -> None:
        self.keys = RedisKeys(prefix)
        self._prefix = prefix
        self.replica_id = replica_id
        self._clock = clock
        self._heartbeat_interval = heartbeat_interval
        self._heartbeat_ms = max(1, math.ceil(heartbeat_ttl * 1000))
        self._recheck_interval = recheck_interval
        self._replica_acks = replica_acks
        self._alone = False  # the last write found the primary without a replica up (see _replicated)
        # WAIT blocks the connection: it must give up before the socket read does (a timeout there
        # would not say why)
        self._ack_timeout_ms = max(1, math.ceil(min(replica_ack_timeout, socket_timeout * 0.75) * 1000))
        # Retried: connection errors only (refused, reset, loading), with a short capped backoff.
        # Timeouts are not retried: the command may have run, and a store call should fail fast.
        self._pool = pool = connection_pool(
            url,
            max_connections=max_connections,
            # Waiting for a free connection is queueing, not a dead server: it gets its own,
            # longer bound than a socket read, so a burst is served late rather than refused.
            timeout=pool_timeout,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            health_check_interval=health_check_interval,
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries,
                        supported_errors=(redis_errors.ConnectionError,)),
        )
        self._redis: Redis = Redis.from_pool(pool)
        self._get_sandbox = self._redis.register_script(lua.GET_SANDBOX)
        self._get_binding = self._redis.register_script(lua.GET_BINDING)
        self._put_binding = self._redis.register_script(lua.PUT_BINDING)
        self._delete_binding = self._redis.register_script(lua.DELETE_BINDING)
        self._reserve = self._redis.register_script(lua.RESERVE_SANDBOX)
        self._mark_ready = self._redis.register_script(lua.MARK_READY)
        self._release = self._redis.register_script(lua.RELEASE_SANDBOX)
        self._begin_suspend = self._redis.register_script(lua.BEGIN_SUSPEND)
        self._mark_suspended = self._redis.register_script(lua.MARK_SUSPENDED)
        self._extend_lease = self._redis.register_script(lua.EXTEND_LEASE)
        self._acquire_lease = self._redis.register_script(lua.ACQUIRE_LEASE)
        self._release_lease = self._redis.register_script(lua.RELEASE_LEASE)
        self._register_fleet_scripts()
        self._origin = uuid.uuid4().hex  # tells this instance's invalidations from other replicas'
        self._listener = RedisListener(self._redis, self.keys, self._origin, connect_timeout=connect_timeout,
                                       on_remote_release=self._forget_streams)
        self._streams: dict[str, int] = {}  # this replica's open streams per sandbox (absolute)
        self._unsynced: set[str] = set()  # sandboxes whose stream count failed to reach redis
        # A stream-count write in flight must not land after a release deleted the counts
        # (it would resurrect them): this replica's syncs and releases take turns.
        self._streams_lock = asyncio.Lock()
        self._heartbeat: asyncio.Task[None] | None = None
        self._closed = False

    @staticmethod
    def binding_value(binding: Binding) -> str:
        """A binding as stored (public so that bulk loaders write exactly what ``put_binding`` does)."""
        return codec.binding_value(binding)

    # bindings ------------------------------------------------------------
    @translated("look up a session")
    async def get_binding(self, session_id: str) -> Binding | None:
        self._listener.start()
        raw = await self._read_binding(session_id)
        return None if raw is None else codec.binding_of(session_id, raw)

    @translated("bind a session")
    async def put_binding(self, binding: Binding) -> Binding:
        self._listener.start()
        stored = await self._replicated(self._put_binding, self._put_binding_call(binding), "a binding")
        return binding if stored is None else codec.binding_of(binding.session_id, stored)

    @translated("delete a session")
    async def delete_binding(self, session_id: str) -> Binding | None:
        key = self.keys.binding(session_id)
        message = self._invalidation("session", session_id)
        for _attempt in range(5):
            raw = await self._read_binding(session_id)
            if raw is None:
                return None
            read = codec.binding_of(session_id, raw)
            deleted = await self._delete_binding(
                keys=[key, self.keys.session_seen, self.keys.sandbox(read.sandbox_id), self.keys.count_sessions],
                args=[session_id, raw, self.keys.invalidate, message, read.pool],
            )
            if deleted is None:
                return None
            if deleted != 0:
                self._listener.notify(session_id)
                return codec.binding_of(session_id, deleted)
        raise StoreUnavailable(f"session {session_id!r} kept changing while being deleted; retry", retry_after=1.0)

    async def _read_binding(self, session_id: str) -> str | None:
        """The binding as stored: its own key, else folded into its per-session sandbox's hash."""
        keys = [self.keys.binding(session_id), self.keys.sandbox(per_session_sandbox_id(session_id))]
        raw: str | None = await _read_again_on_timeout(self._get_binding, keys=keys, args=[session_id])
        return raw

    @translated("list a sandbox's sessions")
    async def sessions_of(self, sandbox_id: str) -> list[str]:
        fields = await self._redis.hkeys(self.keys.sandbox(sandbox_id))
        return sorted(name[1:] for name in fields if name.startswith("+"))

    # sandboxes -----------------------------------------------------------
    @translated("look up a sandbox")
    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        found = await self._read_sandbox(sandbox_id)
        return None if found is None else found[0]

    @translated("reserve a sandbox")
    async def reserve_sandbox(self, record: SandboxRecord, caps: Caps, lease_seconds: float) -> Reservation:
        self._listener.start()
        now = self._clock()
        sandbox_id = record.sandbox_id
        result = await self._replicated(self._reserve, self._reserve_call(record, caps, now, lease_seconds),
                                        "a reservation", undo=(sandbox_id, Reserved.CREATED))
        if result[0] == "cap":
            raise caps.exceeded(record, CapScope(result[1]))
        outcome = Reserved(result[0])
        if outcome is Reserved.TAKEN_OVER:
            self._listener.notify(sandbox_id)
        return Reservation(codec.record_of(sandbox_id, result[1:])[0], outcome)

    @translated("mark a sandbox ready")
    async def mark_ready(self, sandbox_id: str, endpoint: Endpoint,
                         held: Collection[float] | None = None) -> SandboxRecord:
        view = await self._mark_ready(**self._mark_ready_call(sandbox_id, endpoint, held))
        if view is None:
            raise NotReserved(sandbox_id)
        if view == 0:
            raise LeaseLost(sandbox_id)
        *view, previous = view
        if previous == SandboxState.RESUMING:
            self._listener.notify(sandbox_id)  # a resumed sandbox may answer at a new endpoint (others: by pub/sub)
        return codec.record_of(sandbox_id, view)[0]

    @translated("suspend a sandbox")
    async def begin_suspend(self, sandbox_id: str, lease_seconds: float,
                            idle_before: float = math.inf) -> SandboxRecord | None:
        view = await self._begin_suspend(
            keys=[self.keys.sandbox(sandbox_id), self.keys.sandboxes, self.keys.count_state],
            args=[sandbox_id, codec.num(self._clock() + lease_seconds), self.keys.invalidate,
                  self._invalidation("sandbox", sandbox_id),
                  "" if idle_before == math.inf else codec.num(idle_before)])
        if view is None:
            return None
        self._listener.notify(sandbox_id)
        return codec.record_of(sandbox_id, view)[0]

    @translated("renew a lease")
    async def extend_lease(self, sandbox_id: str, held: Collection[float], until: float) -> bool:
        with first():  # ahead of request traffic: a renewal late by a lease loses it
            renewed = await self._extend_lease(keys=[self.keys.sandbox(sandbox_id)],
                                               args=[codec.num(until), *map(codec.num, held)])
        return renewed == 1

    @translated("suspend a sandbox")
    async def mark_suspended(self, sandbox_id: str, error: str | None = None,
                             held: Collection[float] | None = None) -> SandboxRecord | None:
        view = await self._mark_suspended(
            keys=[self.keys.sandbox(sandbox_id), self.keys.sandboxes, self.keys.count_pool, self.keys.count_org,
                  self.keys.count_state],
            args=[sandbox_id, codec.num(self._clock()), error or "", self.keys.settled, self.keys.invalidate,
                  self._invalidation("sandbox", sandbox_id), *_fence(held)])
        if view is None:
            return None
        self._listener.notify(sandbox_id)
        return codec.record_of(sandbox_id, view)[0]

    @translated("release a sandbox")
    async def release_sandbox(self, sandbox_id: str, error: str | None = None,
                              held: Collection[float] | None = None) -> SandboxRecord | None:
        view = await self._release_record(sandbox_id, error, only_endpoint=None, held=held)
        return codec.record_of(sandbox_id, view)[0] if isinstance(view, list) else None

    @translated("release a sandbox")
    async def release_unreachable(self, sandbox_id: str, endpoint: Endpoint) -> Released:
        view = await self._release_record(sandbox_id, None, only_endpoint=endpoint)
        if view == 0:
            return Released.CHANGED
        return Released.ABSENT if view == -1 else Released.RELEASED

    async def _release_record(self, sandbox_id: str, error: str | None, only_endpoint: Endpoint | None,
                              held: Collection[float] | None = None) -> Any:
        async with self._streams_lock:
            view = await self._release(
                keys=[self.keys.sandbox(sandbox_id), self.keys.sandboxes, self.keys.count_pool, self.keys.count_org,
                      self.keys.streams(sandbox_id), self.keys.count_state, self.keys.session_seen],
                args=[sandbox_id, error or "", self.keys.settled, self.keys.invalidate,
                      self._invalidation("sandbox", sandbox_id),
                      "" if only_endpoint is None else codec.endpoint_text(only_endpoint), codec.num(self._clock()),
                      *_fence(held)],
            )
            if isinstance(view, list) or view is None:  # released (or nothing to release)
                self._streams.pop(sandbox_id, None)
                self._unsynced.discard(sandbox_id)
        if isinstance(view, list):
            self._listener.notify(sandbox_id)
        return view

    @translated("wait for a sandbox")
    async def wait_settled(self, sandbox_id: str, timeout: float) -> Settlement:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not self._listener.is_subscribed:
            await self._read_sandbox(sandbox_id)  # while redis is down, fail now and with the cause
            await self.subscribed(self._listener.subscribe_timeout)
        while True:
            # Registered and subscribed before the read: a settlement after the read wakes us.
            with self._listener.waiter(sandbox_id) as waiter:
                found = await self._read_sandbox(sandbox_id)
                if found is None:
                    return Settlement(Settled.REMOVED)
                record, gen = found
                if record.state is SandboxState.SUSPENDED:
                    return Settlement(Settled.SUSPENDED, record)  # reserve again: that wakes it
                if record.state not in UNSETTLED_STATES:
                    return Settlement(Settled.READY, record)
                lease_left = record.lease_until - self._clock()
                if lease_left <= 0:
                    return Settlement(Settled.ABANDONED, record)  # its holder is gone: reserve again, take over
                left = deadline - loop.time()
                if left <= 0:
                    raise SettleTimeout(sandbox_id, timeout)
                with self._listener.parked(sandbox_id):
                    await asyncio.wait((waiter,), timeout=min(left, lease_left, self._recheck_interval))
                if not waiter.done():
                    continue  # a deadline, a lease expiry or a periodic re-check: read again
                message = waiter.result()  # raises StoreUnavailable if the store was closed
                if message is not None and message.get("gen") == gen:
                    if message.get("state") == "removed":
                        return Settlement.removed(message.get("error"))
                    if message.get("state") == "suspended" and message.get("error"):
                        return Settlement(Settled.FAILED, error=message["error"])  # the resume failed
                # "ready", another incarnation's message, or a pub/sub reconnect: read again

    def waiting(self, sandbox_id: str) -> int:
        return self._listener.parked_count(sandbox_id)

    # activity and streams -----------------------------------------------
    @translated("list idle sessions")
    async def idle_sessions(self, before: float, limit: int) -> list[str]:
        return await self._redis.zrangebyscore(self.keys.session_seen, "-inf", f"({codec.num(before)}",
                                               start=0, num=limit)

    @translated("load sessions")
    async def load_ready(self, sessions: Sequence[tuple[Binding, SandboxRecord, Endpoint]]) -> None:
        """Bind each session and make its sandbox ready, many per round trip (one pipeline of the
        very scripts ``put_binding``, ``reserve_sandbox`` and ``mark_ready`` run): for benchmarks and
        bulk loaders, so what they build is exactly what a running gateway writes."""
        now = self._clock()
        async with self._redis.pipeline(transaction=False) as pipe:
            for binding, record, endpoint in sessions:
                await self._put_binding(**self._put_binding_call(binding), client=pipe)
                await self._reserve(**self._reserve_call(record, Caps(), now, 60.0), client=pipe)
                await self._mark_ready(**self._mark_ready_call(record.sandbox_id, endpoint), client=pipe)
            await pipe.execute()

    # the scripts' keys and arguments, built in one place for the single and the bulk calls
    def _put_binding_call(self, binding: Binding) -> dict[str, list[str]]:
        value = codec.binding_value(binding)
        head, tail = codec.folded(binding, value) or (value, "")
        session_id = binding.session_id
        return {"keys": [self.keys.binding(session_id), self.keys.session_seen, self.keys.sandbox(binding.sandbox_id),
                         self.keys.count_sessions, self.keys.sandbox(per_session_sandbox_id(session_id))],
                "args": [head, session_id, codec.num(binding.created_at), binding.pool, tail]}

    def _reserve_call(self, record: SandboxRecord, caps: Caps, now: float, lease_seconds: float) -> dict[str, list[str]]:
        sandbox_id = record.sandbox_id
        return {"keys": [self.keys.sandbox(sandbox_id), self.keys.sandboxes, self.keys.count_pool,
                         self.keys.count_org, self.keys.count_state, self.keys.session_seen, self.keys.indexed],
                "args": [codec.num(now), sandbox_id, record.pool, record.org_id or "",
                         "0" if record.org_id is None else "1",
                         "" if caps.pool_max is None else str(caps.pool_max),
                         "" if caps.org_max is None else str(caps.org_max),
                         codec.num(now + lease_seconds), codec.num(max(record.last_active, record.created_at)),
                         uuid.uuid4().hex[:12], self.keys.invalidate, self._invalidation("sandbox", sandbox_id),
                         *codec.static_fields(record)]}

    def _mark_ready_call(self, sandbox_id: str, endpoint: Endpoint,
                         held: Collection[float] | None = None) -> dict[str, list[str]]:
        return {"keys": [self.keys.sandbox(sandbox_id), self.keys.sandboxes, self.keys.count_state],
                "args": [sandbox_id, codec.endpoint_text(endpoint), self.keys.settled, self.keys.invalidate,
                         self._invalidation("sandbox", sandbox_id), codec.num(self._clock()),
                         *_fence(held)]}

    @translated("read when its data began")
    async def epoch(self) -> float:
        # SET NX GET: the first caller after the data began (a fresh Redis, or one restarted without
        # persistence) writes the time; everyone reads the first writer's.
        now = codec.num(self._clock())
        began = await self._redis.set(self.keys.epoch, now, nx=True, get=True)
        return float(began if began is not None else now)

    # coordination -------------------------------------------------------
    @translated("take a lease")
    async def acquire_lease(self, name: str, holder: str, ttl: float) -> bool:
        now = self._clock()
        with first():  # the reaper's lease, renewed: ahead of request traffic as a wake's is
            held = await self._acquire_lease(keys=[self.keys.lease(name)],
                                             args=[holder, codec.num(now), codec.num(now + ttl),
                                                   max(1, math.ceil(ttl * 1000))])
        return held == 1

    @translated("give up a lease")
    async def release_lease(self, name: str, holder: str) -> None:
        await self._release_lease(keys=[self.keys.lease(name)], args=[holder])

    def subscribe(self, callback: Invalidation) -> None:
        """Call ``callback`` with every session or sandbox ID invalidated on any replica.

        Invalidations made by this instance are delivered synchronously (before the
        call that made them returns); other replicas' arrive through pub/sub.
        """
        self._listener.subscribe(callback)

    async def subscribed(self, timeout: float = 5.0) -> None:
        """Wait until the pub/sub listener is subscribed (starting it if needed).

        Raises ``StoreUnavailable`` when it cannot subscribe within ``timeout``.
        ``wait_settled`` calls this itself; tests and readiness checks may too.
        """
        await self._listener.subscribed(timeout)

    def limit_ledger(self) -> RedisLimitLedger:
        """The installation's org limits (``gateway.limit_leases``), on this store's client; one holder
        per process (the replica ID with a suffix of its own: workers of one replica hold apart)."""
        return RedisLimitLedger(self._redis, self._prefix, f"{self.replica_id}/{uuid.uuid4().hex[:8]}")

    @translated("answer a ping")
    async def ping(self) -> None:
        self._listener.start()
        await self._redis.ping()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._listener.close()
        # Cancelled until done: on Python 3.11, asyncio.wait_for (inside redis-py) can swallow a
        # cancellation that races with a reply; the heartbeat also stops on ``_closed``.
        pending = {self._heartbeat} if self._heartbeat is not None else set()
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.1)
        if self._heartbeat is not None:
            # This replica serves no stream any more: stop counting its streams now.
            try:
                async with asyncio.timeout(1.0):
                    await self._redis.delete(self.keys.replica(self.replica_id))
            except (redis_errors.RedisError, TimeoutError):
                pass
        await self._redis.aclose()
        await close_pool(self._pool)

    # internals ----------------------------------------------------------
    async def _replicated(self, script: Any, call: dict[str, list[str]], what: str,
                          undo: tuple[str, Reserved] | None = None) -> Any:
        """Run a write the gateway acts on (a binding, a reservation); with ``replica_acks``, only
        return once that many replicas have it (WAIT, on the same connection, in one round trip), so
        a failover that promotes a replica cannot forget it. With Sentinel, a primary the sentinels
        see no replica up for (the survivor of a failover) serves alone: nothing is left that could
        keep a copy. Short of that, the write may be on the primary alone (a replica not answering,
        or a primary whose replica was just promoted away from it): the caller gets StoreUnavailable
        and acts on nothing, and a fresh reservation (``undo``: its sandbox and the outcome that
        means fresh) is given back so a retry need not wait out its creation lease."""
        if not self._replica_acks:
            return await script(**call)
        async with self._redis.pipeline(transaction=False) as pipe:
            await script(**call, client=pipe)
            # Alone (below): a short WAIT, still asking the sentinels after each, until a replica is back.
            pipe.execute_command("WAIT", self._replica_acks, _ALONE_WAIT_MS if self._alone else self._ack_timeout_ms)
            result, acked = await pipe.execute()
        if acked >= self._replica_acks:
            self._alone = False
            return result
        if acked >= await self._replicas_up():
            self._alone = True  # every replica there is: a primary left alone after a failover serves alone
            return result
        self._alone = False
        if undo is not None and isinstance(result, list) and result and result[0] == undo[1]:
            with contextlib.suppress(redis_errors.RedisError):
                await self._release_record(undo[0], None, only_endpoint=None)
        log.warning("redis: %s reached %d of %d replicas within %dms (redis_replica_acks)",
                    what, acked, self._replica_acks, self._ack_timeout_ms)
        raise StoreUnavailable(
            f"the session store (redis) could not confirm {what} on {self._replica_acks} replica(s) within "
            f"{self._ack_timeout_ms}ms (redis_replica_acks); retry shortly", retry_after=1.0)

    async def _read_sandbox(self, sandbox_id: str) -> tuple[SandboxRecord, str] | None:
        view = await _read_again_on_timeout(self._get_sandbox, keys=[self.keys.sandbox(sandbox_id), self.keys.sandboxes],
                                            args=[sandbox_id])
        return None if view is None else codec.record_of(sandbox_id, view)

    async def _replicas_up(self) -> int:
        """How many replicas could hold a copy, asked only when WAIT came back short: the sentinels'
        count of replicas up (a plain URL, or no sentinel answering: as many as were asked for, so
        the write is refused)."""
        count = await healthy_replicas(self._pool)
        return self._replica_acks if count is None else count

    def _invalidation(self, kind: str, key: str) -> str:
        return codec.dumps([self._origin, kind, key])


def _fence(held: Collection[float] | None) -> tuple[str, ...]:
    """The trailing arguments of a script fenced by a lease (``held``: the deadlines the caller may hold):
    '1' and each deadline; none when there is no lease to check."""
    return () if held is None else ("1", *map(codec.num, held))
