"""Stream counts and the heartbeat of :class:`~gateway.store.redis.RedisStore` (mixed into it).

Each replica owns one field per sandbox in ``streams:<sandbox_id>`` and writes its absolute count
(a retried write cannot double-count, a failed one is repeated by the next); its counts are
believed only while its heartbeat key ``replica:<replica_id>`` lives, so a replica that dies stops
pinning sandboxes within ``heartbeat_ttl``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from gateway.store.redis_errors import translated
from gateway.store.redis_listener import RedisListener
from gateway.store.redis_scripts import RedisKeys

log = logging.getLogger(__name__)


class RedisStreamCounts:
    """This replica's open streams per sandbox, kept in Redis; ``RedisStore`` sets up the state used here."""

    keys: RedisKeys
    replica_id: str
    _redis: Redis
    _listener: RedisListener
    _origin: str
    _heartbeat_ms: int
    _heartbeat_interval: float
    _streams: dict[str, int]
    _unsynced: set[str]
    _streams_lock: asyncio.Lock
    _heartbeat: asyncio.Task[None] | None
    _closed: bool

    @translated("count open streams")
    async def add_streams(self, deltas: Mapping[str, int]) -> None:
        # Each replica owns one field per sandbox and writes its absolute count: a retried
        # write cannot double-count, and a write that failed is repeated by the next one.
        for sandbox_id, delta in deltas.items():
            total = self._streams.get(sandbox_id, 0) + delta
            if total > 0:
                self._streams[sandbox_id] = total
            else:
                self._streams.pop(sandbox_id, None)
            self._unsynced.add(sandbox_id)
        self._start_heartbeat()
        await self._sync_streams()

    @translated("count open streams")
    async def open_streams(self, sandbox_id: str) -> int:
        counts: dict[str, str] = await self._redis.hgetall(self.keys.streams(sandbox_id))
        if not counts:
            return 0
        replicas = list(counts)
        alive = await self._redis.mget([self.keys.replica(r) for r in replicas])
        return sum(int(counts[r]) for r, beat in zip(replicas, alive, strict=True) if beat is not None)

    async def _sync_streams(self) -> None:
        """Write the heartbeat and every unsynced stream count, in one MULTI."""
        async with self._streams_lock:
            await self._sync_streams_locked()

    async def _sync_streams_locked(self) -> None:
        pending = list(self._unsynced)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.replica(self.replica_id), self._origin, px=self._heartbeat_ms)
            for sandbox_id in pending:
                total = self._streams.get(sandbox_id, 0)
                if total > 0:
                    pipe.hset(self.keys.streams(sandbox_id), self.replica_id, total)
                else:
                    pipe.hdel(self.keys.streams(sandbox_id), self.replica_id)
            await pipe.execute()
        self._unsynced.difference_update(pending)

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None and not self._closed:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat(), name="redis-store-heartbeat")

    def _forget_streams(self, sandbox_id: str) -> None:
        """Released on another replica: its stream counts went with it (as in the memory store)."""
        self._streams.pop(sandbox_id, None)
        self._unsynced.discard(sandbox_id)

    async def _beat(self) -> None:
        """Keep this replica's heartbeat alive (and retry stream counts that failed to land)."""
        while not self._closed:
            try:
                await self._sync_streams()
            except redis_errors.RedisError as exc:
                log.warning("redis heartbeat failed (%s)", type(exc).__name__)
            await self._listener.pause(self._heartbeat_interval)

