"""The Redis store behind Sentinel: the URL form, following a failover, and the replica acknowledgements
(``redis_replica_acks``) that keep reservations and bindings across one. Real redis-server and sentinels."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from redis.asyncio import Redis

from gateway.errors import StoreUnavailable
from gateway.model import Binding, Isolation, Owner, SandboxRecord, SandboxState
from gateway.settings import Settings
from gateway.store.base import Caps, Reserved
from gateway.store.redis import RedisStore
from gateway.store.redis_connect import PrimaryUnreachable, SentinelUrl, parse_sentinel_url
from tests.redis_server import RedisServer, SentinelGroup, sentinel_group  # noqa: F401  (fixture)


@pytest.mark.parametrize(("url", "expected"), [
    pytest.param("redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/sgw",
                 SentinelUrl((("10.0.0.1", 26379), ("10.0.0.2", 26380)), "sgw"), id="two sentinels"),
    pytest.param("redis+sentinel://s1,s2/main/3", SentinelUrl((("s1", 26379), ("s2", 26379)), "main", 3),
                 id="default port, a db"),
    pytest.param("redis+sentinel://:p%40ss@[::1]:5000/sgw?sentinel_password=sp",
                 SentinelUrl((("::1", 5000),), "sgw", password="p@ss", sentinel_password="sp"),
                 id="passwords, IPv6"),
    pytest.param("redis+sentinel://app:pw@h/sgw?sentinel_username=mon&sentinel_password=x",
                 SentinelUrl((("h", 26379),), "sgw", username="app", password="pw", sentinel_username="mon",
                             sentinel_password="x"), id="ACL users"),
    pytest.param("rediss+sentinel://h:1/sgw?ssl_ca_certs=/ca.pem",
                 SentinelUrl((("h", 1),), "sgw", tls=True, ssl_ca_certs="/ca.pem"), id="TLS"),
    pytest.param("redis+sentinel://p%40ss@h/sgw", SentinelUrl((("h", 26379),), "sgw", password="p@ss"),
                 id="a password alone, as redis-py reads it"),
    pytest.param("redis+sentinel://@h/sgw", SentinelUrl((("h", 26379),), "sgw"), id="empty credentials"),
    pytest.param("rediss+sentinel://h/sgw?ssl_cert_reqs=none&ssl_cert_reqs=required",
                 SentinelUrl((("h", 26379),), "sgw", tls=True), id="the last of a repeated option"),
])
def test_sentinel_url_form(url, expected):
    assert parse_sentinel_url(url) == expected
    assert "p@ss" not in repr(parse_sentinel_url(url))  # passwords stay out of logs


@pytest.mark.parametrize(("url", "message"), [
    pytest.param("redis+sentinel:///sgw", "at least one sentinel", id="no sentinel"),
    pytest.param("redis+sentinel://h:26379", "/service_name", id="no service"),
    pytest.param("redis+sentinel://h:26379/sgw/x", "db", id="bad db"),
    pytest.param("redis+sentinel://h:port/sgw", "bad port", id="bad port"),
    pytest.param("redis+sentinel://h/sgw?sentinel_pasword=x", "sentinel_pasword", id="misspelt option"),
    pytest.param("rediss+sentinel://h/sgw?ssl_cert_reqs=maybe", "'required' or 'none'", id="bad ssl_cert_reqs"),
])
def test_a_bad_sentinel_url_is_refused_at_startup(url, message):
    with pytest.raises(ValueError, match=message):
        Settings(redis_url=url)


def binding(session: str, sandbox: str = "shared-1") -> Binding:
    return Binding(session, sandbox, "default", Isolation.SHARED, Owner("org", "u", None), time.time())


def record(sandbox: str) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(sandbox, "default", "org", SandboxState.CREATING, created_at=now, last_active=now,
                         owner=Owner("org", "u", None))


async def promoted(group: SentinelGroup, timeout: float = 30.0) -> int:
    """Wait for the sentinels' ``+switch-master`` and return the new primary's port."""
    client = Redis(port=group.sentinels[0].port, decode_responses=True)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe("+switch-master")
        async with asyncio.timeout(timeout):
            while True:
                if group.sentinels[0].primary() != group.primary.port:
                    break  # switched before we subscribed
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None:
                    break
        port = group.sentinels[0].primary()
        assert port is not None and port != group.primary.port
        return port
    finally:
        await pubsub.aclose()
        await client.aclose()


async def eventually(call, timeout: float = 20.0):
    """``call()`` until it stops raising StoreUnavailable (the store's own retries are bounded)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await call()
            except StoreUnavailable:
                await asyncio.sleep(0.05)  # no event to await: the primary comes back when Sentinel says


@pytest.mark.slow
async def test_the_store_follows_a_failover_and_resubscribes(sentinel_group: SentinelGroup):
    group = sentinel_group
    store = RedisStore(group.url(), "t", "r1", replica_acks=1, replica_ack_timeout=1.5)
    other = RedisStore(group.url(), "t", "r2")
    seen: list[str] = []
    try:
        store.subscribe(seen.append)
        await store.subscribed()
        await store.put_binding(binding("before"))
        group.primary.stop(kill=True)
        new_port = await promoted(group)
        assert new_port == group.replica.port
        # acknowledged by the replica before put_binding returned: the promotion kept it
        found = await eventually(lambda: store.get_binding("before"))
        assert found is not None and found.sandbox_id == "shared-1"
        # the listener resubscribed on the new primary: another replica's invalidation arrives
        await eventually(lambda: store.subscribed(1.0))
        await other.put_binding(binding("elsewhere"))
        await other.delete_binding("elsewhere")
        async with asyncio.timeout(10):
            while "elsewhere" not in seen:
                await asyncio.sleep(0.02)  # pub/sub delivery: polled on the list the callback fills
    finally:
        await store.close()
        await other.close()


@pytest.mark.slow
async def test_a_write_no_replica_acknowledged_is_refused_and_the_reservation_given_back(
        sentinel_group: SentinelGroup):
    group = sentinel_group
    plain = RedisStore(group.primary.url, "t", "r1", replica_acks=1, replica_ack_timeout=1.5)
    sentinel = RedisStore(group.url(), "t", "r2", replica_acks=1, replica_ack_timeout=1.5)
    try:
        reserved = await plain.reserve_sandbox(record("sb-1"), Caps(), 30.0)
        assert reserved.outcome is Reserved.CREATED
        group.replica.pause()  # connected, not answering: WAIT times out
        with pytest.raises(StoreUnavailable, match="redis_replica_acks"):
            await plain.put_binding(binding("s-unacked"))
        with pytest.raises(StoreUnavailable, match="redis_replica_acks"):
            await plain.reserve_sandbox(record("sb-2"), Caps(), 30.0)
        assert await plain.get_sandbox("sb-2") is None  # given back: a retry reserves afresh
        assert await plain.get_sandbox("sb-1") is not None
        group.replica.stop(kill=True)
        # Through Sentinel: once the sentinels see the replica down, the primary serves alone (nothing
        # is left that could keep a copy) ...
        await eventually(lambda: sentinel.put_binding(binding("s-alone")))
        # ... while a plain URL, with nobody to ask whether the replica died or was promoted, refuses.
        with pytest.raises(StoreUnavailable, match="redis_replica_acks"):
            await plain.put_binding(binding("s-plain"))
    finally:
        await plain.close()
        await sentinel.close()


def test_plain_primary_with_a_replica_still_works(sentinel_group: SentinelGroup):
    """The plain URL of a primary that has replicas: WAIT acknowledges through it too."""

    async def run() -> None:
        store = RedisStore(sentinel_group.primary.url, "p", "r1", replica_acks=1, replica_ack_timeout=1.5)
        try:
            await store.put_binding(binding("plain"))
        finally:
            await store.close()

    asyncio.run(run())
    with redis.Redis(port=sentinel_group.replica.port, decode_responses=True) as replica:
        assert replica.exists("{p}:b:plain")


def test_no_primary_is_a_short_retry():
    """Sentinel knows no primary, or the one it names does not answer (a failover under way): 503
    with a Retry-After of a second, not the five of an unreachable plain Redis, and a reason that
    says so."""
    from redis.asyncio.sentinel import MasterNotFoundError

    from gateway.store.redis_errors import unavailable

    mapped = unavailable("bind a session", MasterNotFoundError("No master found for 'sgw'"))
    assert mapped.retry_after == 1.0 and "no primary" in mapped.message
    mapped = unavailable("bind a session", PrimaryUnreachable("Connection refused"))
    assert mapped.retry_after == 1.0 and "primary cannot be reached" in mapped.message
    assert unavailable("bind a session", redis.ConnectionError("refused")).retry_after == 5.0  # plain Redis


@pytest.mark.slow
async def test_a_planned_failover_demotes_the_primary_under_the_store(sentinel_group: SentinelGroup):
    """SENTINEL FAILOVER: the old primary lives on as a replica. Writes through connections to it fail
    READONLY and go to the new primary; the listener still hears every invalidation."""
    group = sentinel_group
    store = RedisStore(group.url(), "t", "r1", replica_acks=1, replica_ack_timeout=1.5)
    other = RedisStore(group.url(), "t", "r2", replica_acks=1, replica_ack_timeout=1.5)
    seen: list[str] = []
    try:
        store.subscribe(seen.append)
        await store.subscribed()
        await store.put_binding(binding("before"))
        await other.put_binding(binding("warm"))  # both have connections to the old primary
        with redis.Redis(port=group.sentinels[0].port) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", group.service)
        assert await promoted(group) == group.replica.port
        await eventually(lambda: store.put_binding(binding("after")))
        await eventually(lambda: other.put_binding(binding("elsewhere")))
        await eventually(lambda: other.delete_binding("elsewhere"))
        async with asyncio.timeout(10):
            while "elsewhere" not in seen:
                await asyncio.sleep(0.02)  # pub/sub delivery: polled on the list the callback fills
        with redis.Redis(port=group.replica.port, decode_responses=True) as new_primary:
            assert new_primary.exists("{t}:b:before", "{t}:b:after") == 2
    finally:
        await store.close()
        await other.close()


async def test_without_any_sentinel_a_call_fails_fast(sentinel_group: SentinelGroup):
    """Every sentinel gone: a store call is a 503 within seconds (redis-py's default retry of each
    sentinel question, backoff up to 10 s, made it 48 s, and a gateway's stop 90 s)."""
    store = RedisStore(sentinel_group.url(), "t", "r1")
    try:
        await store.put_binding(binding("up"))
        for sentinel in sentinel_group.sentinels:
            sentinel.stop()
        sentinel_group.primary.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="primary"):
            await store.get_binding("up")
        with pytest.raises(StoreUnavailable, match="no primary"):  # a new connection asks the sentinels
            await store.get_binding("up")
        assert time.monotonic() - started < 5.0
    finally:
        await store.close()
