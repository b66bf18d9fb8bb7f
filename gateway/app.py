"""The composition root: the one place that picks implementations and wires them.

``Gateway`` owns everything a serving process runs (store, providers, session
router, data plane, control API, background loops) and starts and stops them in
order. Nothing here runs at import time; ``serve`` in ``gateway.server`` binds
sockets and supervises worker processes around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.api import create_control_app
from gateway.auth import AdminCheck, AdminTokens, AllowAll, Authenticator, KeySet, TokenAuth, TrustedHeaders
from gateway.compat import RouterCompat
from gateway.errors import GatewayError
from gateway.logs import AccessLog, access_log
from gateway.metrics import Metrics, status_class
from gateway.model import SandboxState
from gateway.providers.base import PoolProviders, SandboxProvider
from gateway.sessions import RouterTuning, SessionRouter
from gateway.settings import SESSION_TTL_SETTING, Settings
from gateway.store.base import SessionStore
from gateway.store.instrumented import InstrumentedStore
from routing import Policy, PolicyError, default_policy, parse_org_list, parse_policy

if TYPE_CHECKING:
    from gateway.providers.local import Confinement

log = logging.getLogger("gateway")
STOP_TASKS_TIMEOUT = 5.0  # how long stop() waits for the background loops to end
ACCESS_LOG_FLUSH_INTERVAL = 0.25  # access lines are written in batches (gateway.logs.AccessLog)


def load_policy(settings: Settings) -> Policy:
    """The policy file if one is configured, else the built-in default; env orgs merged in."""
    extra = parse_org_list(settings.per_session_org_ids)
    if settings.policy_file is None:
        policy = default_policy(extra)
    else:
        path = settings.policy_file
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError([f"{path}: cannot read the policy file: {exc.strerror}"]) from None
        policy = parse_policy(text, str(path), extra)
    policy.check_session_ttl(settings.session_ttl, SESSION_TTL_SETTING)  # at startup and on every reload
    return policy


def build_auth(settings: Settings) -> tuple[Authenticator, AdminCheck]:
    """Data-plane authenticator and control-API admin check, from settings."""
    keys = KeySet.load(settings.auth_keys_file) if settings.auth_keys_file is not None else None
    admin: AdminCheck = AdminTokens(keys) if keys is not None else AllowAll()
    if settings.effective_auth_mode == "token":
        assert keys is not None  # Settings validation guarantees a key file in token mode
        return TokenAuth(keys), admin
    return TrustedHeaders(), admin


def build_store(settings: Settings) -> SessionStore:
    if settings.redis_url:
        from gateway.store.redis import RedisStore  # imported only when selected

        return RedisStore(settings.redis_url, settings.redis_prefix, settings.replica_id)
    from gateway.store.memory import MemoryStore

    return MemoryStore()


def build_confinement(settings: Settings) -> Confinement:
    """bubblewrap, or (only when the settings accept it) nothing, where bubblewrap cannot run."""
    from gateway.providers.confine import Bubblewrap, Unconfined

    bubblewrap = Bubblewrap(Path(settings.data_dir).absolute())
    if not settings.local_unconfined:
        return bubblewrap
    try:
        bubblewrap.check()
    except RuntimeError as exc:
        log.warning("local sandboxes are NOT confined (SANDBOX_GATEWAY_LOCAL_UNCONFINED): %s; each runs as the "
                    "gateway's user, sees the host's files and reaches its loopback ports", exc)
        return Unconfined(sys.executable)
    return bubblewrap


def confinement_problem(settings: Settings) -> str | None:
    """Why local sandboxes cannot start here (checked once before any worker starts), or None."""
    policy = load_policy(settings)
    if not any(p.provider == "local" for p in policy.pools.values()):
        return None
    from gateway.providers.confine import Bubblewrap
    from gateway.providers.local import check_networks

    bubblewrap = Bubblewrap(Path(settings.data_dir).absolute())
    try:
        bubblewrap.check()
    except RuntimeError as exc:
        if settings.local_unconfined:
            return None
        return (f"local sandboxes cannot be confined: {exc}. Install bubblewrap, or set "
                "SANDBOX_GATEWAY_LOCAL_UNCONFINED=1 to accept sandboxes that see the host and each other")
    try:
        check_networks(bubblewrap, local_networks(policy), policy.source)
    except RuntimeError as exc:
        return str(exc)
    return None


def local_networks(policy: Policy) -> dict[str, str]:
    """Each local pool's ``network`` setting (pools.<name>.local.network)."""
    return {name: pool.network for name, pool in policy.pools.items() if pool.provider == "local"}


def build_providers(settings: Settings, policy: Policy) -> PoolProviders:
    """One provider instance per kind, serving every pool of that kind."""
    by_kind: dict[str, list[str]] = {}
    for name, pool in policy.pools.items():
        by_kind.setdefault(pool.provider, []).append(name)
    instances: dict[str, SandboxProvider] = {}
    if "local" in by_kind:
        from gateway.providers.local import LocalProvider

        instances["local"] = LocalProvider(Path(settings.data_dir), stop_on_close=settings.store_kind == "memory",
                                           confinement=build_confinement(settings), networks=local_networks(policy),
                                           policy_source=policy.source)
    if "static" in by_kind:
        from gateway.providers.static import StaticProvider

        instances["static"] = StaticProvider({p: policy.pools[p].upstreams or [] for p in by_kind["static"]})
    if "kubernetes" in by_kind:
        from gateway.providers.kubernetes import KubernetesProvider

        instances["kubernetes"] = KubernetesProvider.from_policy(settings, policy, by_kind["kubernetes"])
    return PoolProviders({name: instances[kind] for kind, names in by_kind.items() for name in names})


class Gateway:
    """One serving process: build with :meth:`create`, then :meth:`start` and :meth:`stop`."""

    def __init__(self, settings: Settings, policy: Policy, store: SessionStore | InstrumentedStore, provider: PoolProviders,
                 metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.metrics = metrics
        self.router = SessionRouter(
            store, provider, policy, replica_id=settings.replica_id,
            tuning=RouterTuning(route_ttl=settings.route_cache_ttl, route_stale_ttl=settings.route_stale_ttl,
                                session_ttl=settings.session_ttl, lease_seconds=settings.creation_lease),
            events=metrics,
        )
        self.authenticator, self.admin = build_auth(settings)
        self._locator: Any = None  # a kubernetes SandboxLocator when the router headers are on
        self.compat: RouterCompat | None = None
        if settings.router_compat_namespaces:
            from gateway.providers.kubernetes import SandboxLocator

            self._locator = SandboxLocator(settings.router_compat_api_version, kubeconfig=settings.kubeconfig)
            self.compat = RouterCompat(settings.router_compat_namespaces, settings.router_compat_ports, self.admin,
                                       self._locator)
        self.data_plane: Any = None
        self._control_runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._policy_mtime: float | None = None
        self._access: AccessLog | None = None  # set by start(): when settings.access_log and INFO is logged
        self._request_series: dict[tuple[str | None, str, int], tuple[Any, Any]] = {}
        self.data_address: tuple[str, int] | None = None
        self.control_address: tuple[str, int] | None = None

    @classmethod
    def create(cls, settings: Settings) -> Gateway:
        policy = load_policy(settings)
        metrics = Metrics(per_org=settings.per_org_metrics, org_label_limit=settings.org_label_limit)
        store = InstrumentedStore(build_store(settings), metrics)
        return cls(settings, policy, store, build_providers(settings, policy), metrics)

    async def start(self, data_sock: socket.socket, control_sock: socket.socket) -> None:
        from gateway.proxy import DataPlane

        await self.provider.start(self.router.sandbox_lost)
        if self._locator is not None:
            await self._locator.start()
        self.data_plane = DataPlane(self.router, self.settings, on_request=self._on_request,
                                    authenticator=self.authenticator,  # its OrgLimits come from the settings
                                    compat=self.compat)
        await self.data_plane.start(data_sock)
        control = create_control_app(self.router, self.readiness, self.metrics, self.admin,
                                     warnings=self._provider_warnings())
        self._control_runner = web.AppRunner(control, access_log=None, handle_signals=False)
        await self._control_runner.setup()
        await web.SockSite(self._control_runner, control_sock).start()
        self.data_address = data_sock.getsockname()[:2]
        self.control_address = control_sock.getsockname()[:2]
        self._access = access_log() if self.settings.access_log else None
        if self._access is not None:
            self._every(ACCESS_LOG_FLUSH_INTERVAL, self._flush_access_log)
        self._every(self.settings.activity_flush_interval, self.router.flush_activity)
        self._every(self.settings.reap_interval, self._reap)
        self._every(5.0, self._refresh_gauges)
        if self.settings.policy_file is not None:
            self._policy_mtime = self.settings.policy_file.stat().st_mtime
            self._every(2.0, self._reload_policy)

    def _provider_warnings(self) -> list[str]:
        """What ``GET /v1/sandboxes`` tells every caller about this installation's sandboxes."""
        from gateway.providers.local import LocalProvider

        unconfined = sorted(name for name, pool in self.router.policy.pools.items() if pool.provider == "local"
                            and isinstance(p := self.provider.for_pool(name), LocalProvider) and not p.confined)
        if not unconfined:
            return []
        return [f"local sandboxes in pools {', '.join(unconfined)} are not confined "
                "(SANDBOX_GATEWAY_LOCAL_UNCONFINED): they see the host, each other and the gateway's ports"]

    async def stop(self) -> None:
        """Drain: stop accepting, let in-flight requests finish (bounded), leave sandboxes alive."""
        if self.data_plane is not None:
            await self.data_plane.stop(self.settings.drain_timeout)
        if self._control_runner is not None:
            await self._control_runner.cleanup()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Bounded: a client library that swallows a cancellation must not keep the process alive.
            _, stuck = await asyncio.wait(self._tasks, timeout=STOP_TASKS_TIMEOUT)
            for task in stuck:
                log.warning("background task %s did not stop within %gs; leaving it", task.get_name(),
                            STOP_TASKS_TIMEOUT)
        with contextlib.suppress(GatewayError):
            await self.router.flush_activity()
        if self._access is not None:
            self._access.flush()
        await self.provider.close()
        if self._locator is not None:
            await self._locator.close()
        await self.store.close()

    async def readiness(self) -> list[str]:
        problems = []
        try:
            await self.store.ping()
        except GatewayError as exc:
            problems.append(f"store: {exc.message}")
        return problems

    def describe(self) -> list[str]:
        policy = self.router.policy
        pools = ", ".join(f"{name} ({pool.provider})" for name, pool in policy.pools.items())
        providers = [f"provider: {line}" for line in self.provider.describe()]
        return [f"auth: {self.settings.effective_auth_mode}"
                f"{'' if isinstance(self.admin, AllowAll) else ' (control API needs an admin token)'}",
                f"store: {self.settings.store_kind}", f"policy: {policy.source}", f"pools: {pools}",
                f"per-session orgs: {', '.join(sorted(policy.per_session_orgs)) or '(none)'}", *providers,
                "router headers: " + (f"namespaces {', '.join(self.settings.router_compat_namespaces)}, ports "
                                      f"{', '.join(map(str, self.settings.router_compat_ports))}, admin token"
                                      if self.compat is not None else "off")]

    # background work ------------------------------------------------------
    def _every(self, interval: float, job: Callable[[], Awaitable[Any]]) -> None:
        async def loop() -> None:
            task = asyncio.current_task()
            # cancelling(): a job whose library swallowed our CancelledError (redis-py can, when a
            # reply lands as the cancel does) still ends the loop instead of sleeping on forever.
            while task is None or not task.cancelling():
                await asyncio.sleep(interval)
                try:
                    await job()
                except GatewayError as exc:
                    log.warning("%s failed: %s", job.__name__, exc.message)
                except Exception:
                    log.exception("%s failed", job.__name__)

        self._tasks.append(asyncio.create_task(loop(), name=f"every-{job.__name__}"))

    async def _flush_access_log(self) -> None:
        self._access.flush()  # type: ignore[union-attr]

    async def _reap(self) -> None:
        for sandbox_id in await self.router.reap_once():
            log.info("reaped idle sandbox %s", sandbox_id)
        await self.router.sweep_orphans(self.settings.orphan_grace)

    async def _refresh_gauges(self) -> None:
        """Store-wide session and sandbox counts (every replica reports the same; dashboards take max)."""
        m = self.metrics
        m.in_flight.set(self.data_plane.in_flight)
        m.open_streams.set(self.data_plane.open_streams)
        sandboxes: dict[tuple[str, str], int] = {}
        sessions: dict[str, int] = {}
        for record in await self.store.list_sandboxes():
            key = (record.pool, record.state.value)
            sandboxes[key] = sandboxes.get(key, 0) + 1
            sessions[record.pool] = sessions.get(record.pool, 0) + record.sessions
        for name in self.router.policy.pools:
            m.sessions.labels(name).set(sessions.get(name, 0))
            for state in SandboxState:
                m.sandboxes.labels(name, state.value).set(sandboxes.get((name, state.value), 0))

    async def _reload_policy(self) -> None:
        """Hot reload: a changed file replaces the policy for new sessions; a bad one is refused."""
        path = self.settings.policy_file
        assert path is not None
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return
        if mtime == self._policy_mtime:
            return
        self._policy_mtime = mtime
        try:
            self.router.policy = load_policy(self.settings)
        except PolicyError as exc:
            log.error("policy reload failed, keeping the previous policy:\n%s", exc)
            return
        log.info("policy reloaded from %s", path)

    def _on_request(self, entry: Any) -> None:
        m = self.metrics
        key = (entry.pool, entry.protocol, entry.status)
        children = self._request_series.get(key)
        if children is None:  # resolving label children costs more than the increments themselves
            pool = entry.pool or "none"
            children = (m.requests.labels(pool, entry.protocol, status_class(entry.status)),
                        m.request_duration.labels(pool, entry.protocol))
            self._request_series[key] = children
        children[0].inc()
        children[1].observe(entry.duration)
        if entry.error:
            m.upstream_errors.labels(entry.error).inc()
        if entry.refused:
            m.capacity_rejected(entry.refused)
        if m.per_org:
            m.org_requests.labels(m.org_label(entry.org_id), status_class(entry.status)).inc()
        if self._access is not None:
            self._access.log(entry)
