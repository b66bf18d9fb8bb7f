"""Every Kubernetes API call of the provider, retried where a retry can save it, and timed.

A real apiserver throttles (API Priority and Fairness answers 429 with ``Retry-After``), restarts
(5xx, dropped connections, refused connections) and stalls. :func:`call` retries exactly those:
429, 500, 502, 503, 504 and connection errors and timeouts, with exponential backoff and full
jitter (so replicas that were refused together do not come back together), never sooner than a
``Retry-After`` says, and never past the caller's own deadline (a provisioning or wake timeout):
when the next try could not start before it, the last error is raised at once rather than slept
on. Anything else (403, 404, 409, 422, ...) is an answer and is raised as the typed error
``translated`` makes of it.

A create that is retried after its connection dropped may have been stored: the retry then gets
409 and the caller adopts its own object (owner and installation checked), so a create stays
exactly-once. Non-watch calls get connect and read timeouts (``_request_timeout``), capped by the
deadline, so a stalled apiserver is a retried error rather than a hang.

Each answer is counted and timed through :class:`KubeObserver` (``sgw_kube_requests_total``,
``sgw_kube_request_seconds``), and the time of the last answer that was not a refusal of our
credentials is kept for ``/readyz`` (:attr:`KubeObserver.healthy`).
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from gateway.errors import KubeApiError
from gateway.providers.kubernetes_api import translated

T = TypeVar("T")

RETRYABLE = frozenset({429, 500, 502, 503, 504})
#: connect and read timeouts of one non-watch call (seconds).
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0
#: The budget of a call no user request waits on (a cleanup delete, a listing, a probe).
BACKGROUND_BUDGET = 30.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: try n waits uniform(0, min(cap, base * 2**n))."""

    base: float = 0.1
    cap: float = 5.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.cap, self.base * (2 ** attempt)))


@dataclass
class KubeObserver:
    """Where calls and watches report: counters for the metrics, and API health for ``/readyz``.

    ``on_request(verb, resource, code, seconds)`` and ``on_watch_restart(reason)`` are the metric
    hooks (gateway.metrics); ``code`` is the HTTP status or ``"error"`` for no answer.
    """

    on_request: Callable[[str, str, str, float], None] | None = None
    on_watch_restart: Callable[[str], None] | None = None
    last_ok: float = field(default_factory=time.monotonic)
    failing_since: float | None = None

    def answered(self, verb: str, resource: str, code: str, seconds: float) -> None:
        if self.on_request is not None:
            self.on_request(verb, resource, code, seconds)
        if code in ("error", "401", "403") or (code.isdigit() and int(code) >= 500):
            if self.failing_since is None:
                self.failing_since = time.monotonic()
        else:
            self.last_ok = time.monotonic()
            self.failing_since = None

    def watch_restarted(self, reason: str) -> None:
        if self.on_watch_restart is not None:
            self.on_watch_restart(reason)

    def healthy(self, grace: float) -> bool:
        """False once every call for ``grace`` seconds was unanswered, a 5xx, or refused (401/403)."""
        return self.failing_since is None or time.monotonic() - self.failing_since < grace


def retry_after(exc: ApiException) -> float | None:
    """``Retry-After`` of a refusal, in seconds (delta-seconds or an HTTP date), else None."""
    value = (exc.headers or {}).get("Retry-After") if exc.headers is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None




class Calls:
    """Retrying, timed API calls; one per provider (its backoff, its random source, its observer)."""

    def __init__(self, observer: KubeObserver | None = None, backoff: Backoff = Backoff(),
                 rng: random.Random | None = None, *, connect_timeout: float = CONNECT_TIMEOUT,
                 read_timeout: float = READ_TIMEOUT, background_budget: float = BACKGROUND_BUDGET) -> None:
        self.observer = observer or KubeObserver()
        self.backoff = backoff
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.background_budget = background_budget
        self._rng = rng or random.Random()

    def request_timeout(self, deadline: float) -> aiohttp.ClientTimeout:
        """Connect and read timeouts for one non-watch call, the whole call capped by ``deadline``."""
        remaining = max(0.01, deadline - asyncio.get_running_loop().time())
        connect, read = min(self.connect_timeout, remaining), min(self.read_timeout, remaining)
        return aiohttp.ClientTimeout(total=remaining, connect=connect, sock_connect=connect, sock_read=read)

    def deadline(self, seconds: float | None = None) -> float:
        """Loop time ``seconds`` from now (default: the budget of a call no user request waits on)."""
        return asyncio.get_running_loop().time() + (self.background_budget if seconds is None else seconds)

    def pause(self, attempt: int) -> float:
        return self.backoff.delay(attempt, self._rng)

    async def call(self, verb: str, resource: str, doing: str, make: Callable[[aiohttp.ClientTimeout], Awaitable[T]],
                   *, deadline: float, sandbox_id: str | None = None) -> T:
        """``make(timeout)``'s answer, retried as the module says until ``deadline`` (loop time).

        Raises the typed ``KubeApiError`` of the last answer (or of the connection error).
        """
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            began = loop.time()
            wait: float | None
            try:
                with translated(doing, sandbox_id):
                    try:
                        result = await make(self.request_timeout(deadline))
                    except ApiException as exc:
                        self.observer.answered(verb, resource, str(exc.status or "error"), loop.time() - began)
                        raise
                self.observer.answered(verb, resource, "200", loop.time() - began)
                return result
            except KubeApiError as exc:
                cause = exc.__cause__
                status = getattr(cause, "status", None)
                if status not in RETRYABLE:
                    raise
                error: KubeApiError = exc
                wait = retry_after(cause) if isinstance(cause, ApiException) else None
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.observer.answered(verb, resource, "error", loop.time() - began)
                error = KubeApiError(f"Kubernetes API unreachable ({type(exc).__name__}: {exc}) while {doing}",
                                     sandbox_id=sandbox_id)
                error.__cause__ = exc
                wait = None
            pause = self.pause(attempt)
            wait = pause if wait is None else max(wait, pause)
            attempt += 1
            if loop.time() + wait >= deadline:
                error.message = f"{error.message} (tried {attempt} times within its deadline)"
                raise error
            await asyncio.sleep(wait)


Make = Callable[[aiohttp.ClientTimeout], Awaitable[Any]]
