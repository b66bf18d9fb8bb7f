"""How the Redis store reaches its Redis: a plain URL, or a Sentinel-managed primary.

``redis_url`` takes redis-py's own forms (``redis://``, ``rediss://``, ``unix://``) for a single
primary (with or without replicas behind it: replicas are the operator's business then, and a
managed Redis that fails over behind one DNS name needs nothing more), and one more form for
Sentinel::

    redis+sentinel://[[user]:password@]host1[:port1][,host2[:port2]...]/service_name[/db][?options]
    rediss+sentinel://...   the same over TLS, to the sentinels and to the data nodes

- ``host:port`` pairs are the sentinels (port 26379 when left out); any one that answers is enough.
- ``service_name`` is the name the sentinels monitor (``sentinel monitor <service_name> ...``).
- ``user``/``password`` are the data nodes' (``requirepass``/ACL), not the sentinels'.
- options: ``sentinel_password`` and ``sentinel_username`` (the sentinels' own ``requirepass``),
  ``ssl_ca_certs`` (a PEM bundle for TLS), ``ssl_cert_reqs`` (``required``, the default, or
  ``none``). Percent-encode reserved characters in passwords.

This is the form Celery/kombu and several Redis tools read (``sentinel://`` there), with the
``redis+`` prefix so that a URL says which protocol it speaks.

With Sentinel, every connection asks the sentinels for the current primary when it (re)connects
(redis-py's ``SentinelConnectionPool``); a connection to a demoted primary fails its next write
(READONLY) and reconnects to the new one, and Sentinel itself closes the demoted primary's client
connections (pub/sub ones included), so the listener resubscribes on the new primary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import ConnectionPool, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.exceptions import ConnectionError, RedisError  # noqa: A004  (redis-py's, not the builtin)

from gateway.store.redis_pool import FairBlockingPool, FairWaits

__all__ = ["SENTINEL_SCHEMES", "PrimaryUnreachable", "SentinelUrl", "close_pool", "connection_pool", "healthy_replicas",
           "is_sentinel_url", "parse_sentinel_url"]

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
_OPTIONS = {"sentinel_password", "sentinel_username", "ssl_ca_certs", "ssl_cert_reqs"}


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed ``redis+sentinel://`` URL (``repr`` hides the passwords)."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    tls: bool = False
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: str = "required"

    def tls_kwargs(self) -> dict[str, Any]:
        if not self.tls:
            return {}
        return {"ssl": True, "ssl_ca_certs": self.ssl_ca_certs, "ssl_cert_reqs": self.ssl_cert_reqs}


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Parse the Sentinel form; ``ValueError`` naming what is wrong (never echoing a password)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError(f"a Sentinel redis_url starts with {' or '.join(s + '://' for s in SENTINEL_SCHEMES)}")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    username, password, hosts = _credentials(netloc)
    sentinels = tuple(_host_port(part) for part in hosts.split(",") if part)
    if not sentinels:
        raise ValueError("a Sentinel redis_url names at least one sentinel: redis+sentinel://host:26379/service_name")
    service_name, db = _service_and_db(path)
    options = _options(query)
    return SentinelUrl(sentinels=sentinels, service_name=service_name, db=db, username=username,
                       password=password, sentinel_username=options.get("sentinel_username") or None,
                       sentinel_password=options.get("sentinel_password") or None,
                       tls=scheme.lower().startswith("rediss"), ssl_ca_certs=options.get("ssl_ca_certs") or None,
                       ssl_cert_reqs=options.get("ssl_cert_reqs", "required"))


def _credentials(netloc: str) -> tuple[str | None, str | None, str]:
    """``[[user]:password@]hosts`` as (username, password, hosts)."""
    userinfo, at, hosts = netloc.rpartition("@")
    if not at or not userinfo:
        return None, None, hosts if at else netloc
    user, colon, secret = userinfo.partition(":")
    if not colon:  # redis://secret@host means a password, as in redis-py
        return None, unquote(user), hosts
    return unquote(user) or None, unquote(secret), hosts


def _service_and_db(path: str) -> tuple[str, int]:
    """``service_name[/db]`` as (service name, db number)."""
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ValueError("a Sentinel redis_url ends in /service_name or /service_name/db")
    if len(parts) == 2 and not parts[1].isdigit():
        raise ValueError(f"the db of a Sentinel redis_url is a number, not {parts[1]!r}")
    return unquote(parts[0]), int(parts[1]) if len(parts) == 2 else 0


def _options(query: str) -> dict[str, str]:
    """The query's options (the last of a repeated one), every one known and valid."""
    options = {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ValueError(f"unknown option(s) in the Sentinel redis_url: {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(_OPTIONS))})")
    if options.get("ssl_cert_reqs", "required") not in ("required", "none"):
        raise ValueError("ssl_cert_reqs in the Sentinel redis_url is 'required' or 'none'")
    return options


def _host_port(text: str) -> tuple[str, int]:
    if text.startswith("["):  # [::1]:26379
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise ValueError(f"a sentinel address in redis_url has no host: {text!r}")
    if port and not port.isdigit():
        raise ValueError(f"a sentinel address in redis_url has a bad port: {text!r}")
    return host, int(port) if port else DEFAULT_SENTINEL_PORT


class PrimaryUnreachable(ConnectionError):
    """The primary the sentinels name does not answer: most likely a failover under way (it was
    killed and Sentinel has not yet promoted a replica), so a retry in a second or two may succeed."""


class _SentinelConnection(SentinelManagedConnection):
    """Tells a connect that failed (every path to one: the pool's, and a command's own retry) from
    other connection errors, by type."""

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().connect_check_health(*args, **kwargs)
        except (MasterNotFoundError, PrimaryUnreachable):
            raise
        except ConnectionError as exc:
            raise PrimaryUnreachable(str(exc)) from exc


class _SentinelSSLConnection(_SentinelConnection, SSLConnection):
    pass


class BlockingSentinelPool(FairWaits, SentinelConnectionPool, BlockingConnectionPool):
    """``SentinelConnectionPool`` that waits for a free connection (``timeout``) instead of
    refusing past ``max_connections``, as the plain URL's pool does: a burst is served late, not
    refused, whichever way Redis is reached (in order: ``gateway.store.redis_pool``)."""


def connection_pool(url: str, *, max_connections: int, timeout: float, **kwargs: Any) -> ConnectionPool:
    """The store's pool for ``url``; ``kwargs`` are the connection options (timeouts, retry, decoding)."""
    if not is_sentinel_url(url):
        return FairBlockingPool.from_url(url, max_connections=max_connections, timeout=timeout, **kwargs)
    parsed = parse_sentinel_url(url)
    socket_options = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    # One try per sentinel per question: the store's own retry repeats the whole question, and
    # redis-py's default (3 retries, backoff up to 10 s) made a stop with every sentinel gone take
    # 90 s.
    sentinel_kwargs: dict[str, Any] = {**socket_options, **parsed.tls_kwargs(), "retry": Retry(NoBackoff(), 0)}
    if parsed.sentinel_password is not None:
        sentinel_kwargs["password"] = parsed.sentinel_password
    if parsed.sentinel_username is not None:
        sentinel_kwargs["username"] = parsed.sentinel_username
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_kwargs)
    tls = parsed.tls_kwargs()
    tls.pop("ssl", None)
    return BlockingSentinelPool(parsed.service_name, sentinel, max_connections=max_connections, timeout=timeout,
                                db=parsed.db, username=parsed.username, password=parsed.password,
                                connection_class=_SentinelSSLConnection if parsed.tls else _SentinelConnection,
                                **tls, **kwargs)


async def close_pool(pool: ConnectionPool) -> None:
    """Close what the pool opened besides its connections: a Sentinel pool's sentinel clients."""
    if isinstance(pool, SentinelConnectionPool):
        await pool.sentinel_manager.aclose()


async def healthy_replicas(pool: ConnectionPool) -> int | None:
    """How many replicas the sentinels see up for the pool's primary; None for a plain URL (nobody
    to ask) or when no sentinel answers. A primary's own view (ROLE) cannot tell a replica that died
    from one that was just promoted away from it; the sentinels can, and until they see the
    promoted one's old primary down they list it as a replica."""
    if not isinstance(pool, SentinelConnectionPool):
        return None
    for sentinel in pool.sentinel_manager.sentinels:
        try:
            replicas = await sentinel.sentinel_slaves(pool.service_name)
        except RedisError:
            continue
        # down: as the sentinels judge it (after down-after-milliseconds), or already unreachable to
        # them (a dead old primary re-listed as a replica after the promotion is at once)
        return sum(1 for r in replicas if not (r["is_sdown"] or r["is_odown"] or r.get("is_disconnected")))
    return None
