"""The composition root: the one place that picks implementations and wires them.

``Gateway`` owns everything a serving process runs (store, providers, session
router, data plane, control API, background loops). ``start`` brings them up one
by one, pushing each one's teardown on an exit stack as it goes; ``stop`` (or a
failure halfway through ``start``) unwinds that stack, so teardown is setup in
reverse and every part that started is stopped even when another part's stop
fails. Nothing here runs at import time; ``serve`` in ``gateway.server`` binds
sockets and supervises worker processes around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway import _compiled
from gateway.access import AccessTokens
from gateway.api import ControlRunner, create_control_app
from gateway.auth import AdminCheck, AdminTokens, AllowAll, Authenticator, KeySet, TokenAuth, TrustedHeaders
from gateway.compat import RouterCompat
from gateway.grants import AccessGrants, Grants, McpTarget, NoGrants
from gateway.hosts import AllowedHosts, default_allowed_hosts
from gateway.errors import GatewayError
from gateway.gate import ConnectionGate, connection_bounds
from gateway.grpcfront import GrpcFront, GrpcMetrics
from gateway.lifecycle import Lifecycle, ReaperLease
from gateway.limit_leases import SharedOrgLimits
from gateway.limits import OrgLimits
from gateway.logs import AccessLog
from gateway.metrics import Metrics, RequestMetrics
from gateway.model import SandboxState
from gateway.policy import PolicyView, load_policy
from gateway.providers.base import PoolProviders, SandboxProvider
from gateway.providers.confine import Bubblewrap, Unconfined, host_sandbox_cap
from gateway.providers.local import Confinement, LocalProvider, check_networks
from gateway.providers.static import StaticProvider
from gateway.proxy import DataPlane, NoRouterHeaders, PlaneOptions, PreviewKeys, RequestHooks, RequestLog
from gateway.sessions import RouterTuning, SessionRouter
from gateway.settings import Settings, option
from gateway.store.base import SessionStore
from gateway.store.instrumented import InstrumentedStore
from gateway.store.memory import MemoryStore
from gateway.tracing import Tracer
from routing import Policy, PolicyError

if TYPE_CHECKING:
    from gateway.compat_locator import KubernetesSandboxLocator

log = logging.getLogger("gateway")
STOP_TASKS_TIMEOUT = 5.0  # how long stop() waits for the background loops to end
ACCESS_LOG_FLUSH_INTERVAL = 0.25  # access lines are written in batches (gateway.logs.AccessLog)


def build_auth(settings: Settings) -> tuple[Authenticator, AdminCheck]:
    """Data-plane authenticator and control-API admin check, from settings."""
    keys = KeySet.load(settings.auth_keys_file) if settings.auth_keys_file is not None else None
    admin: AdminCheck = AdminTokens(keys) if keys is not None else AllowAll()
    if settings.effective_auth_mode == "token":
        assert keys is not None  # Settings validation guarantees a key file in token mode
        return TokenAuth(keys), admin
    return TrustedHeaders(), admin


def example_keys_problem(settings: Settings) -> str | None:
    """Why the key file must not serve off loopback (checked before any port is bound), or None.

    The published example secret lets anyone who has read the README mint admin tokens: it is
    accepted on loopback, or anywhere with ``allow_example_keys`` (a demo)."""
    path = settings.auth_keys_file
    if path is None:
        return None
    try:
        keys = KeySet.load(path)
    except OSError as exc:
        return f"{option('auth_keys_file')}: cannot read {path}: {exc.strerror or exc}"
    except ValueError as exc:
        return f"{option('auth_keys_file')}: {exc}"
    published = keys.published()
    if not published or settings.allow_example_keys or settings.on_loopback:
        return None
    return (f"{path}: key {published[0]!r} has the secret published in examples/auth/keys.yaml, and anyone who "
            f"has read the README can sign admin tokens with it; listening on {settings.host} needs your own "
            "secret (e.g. from `openssl rand -hex 32`), or, for a demo, "
            f"{option('allow_example_keys')}=1")


def build_access(settings: Settings) -> AccessTokens | None:
    """Sandbox access tokens, signed and checked with the auth keys; None without a key file."""
    if settings.auth_keys_file is None:
        return None
    return AccessTokens(KeySet.load(settings.auth_keys_file), max_ttl=settings.access_token_max_ttl)


def build_store(settings: Settings) -> SessionStore:
    if settings.redis_url:
        # Imported only when selected: the Redis client is a heavy import a memory-store process never needs.
        from gateway.store.redis import RedisStore

        return RedisStore(settings.redis_url, settings.redis_prefix, settings.replica_id,
                          replica_acks=settings.redis_replica_acks,
                          replica_ack_timeout=settings.redis_replica_ack_timeout)
    return MemoryStore()


def build_confinement(settings: Settings) -> Confinement:
    """bubblewrap, or (only when the settings accept it) nothing, where bubblewrap cannot run."""
    bubblewrap = Bubblewrap(Path(settings.data_dir).absolute(), disk_quota=settings.local_disk_quota_bytes)
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


def plane_options(settings: Settings) -> PlaneOptions:
    """What the data plane reads of the settings: each ``PlaneOptions`` field from the setting of its name."""
    return PlaneOptions(**{field.name: getattr(settings, field.name) for field in dataclasses.fields(PlaneOptions)})


def build_providers(settings: Settings, policy: Policy, metrics: Metrics | None = None) -> PoolProviders:
    """One provider instance per kind, serving every pool of that kind."""
    by_kind: dict[str, list[str]] = {}
    for name, pool in policy.pools.items():
        by_kind.setdefault(pool.provider, []).append(name)
    instances: dict[str, SandboxProvider] = {}
    if "local" in by_kind:
        instances["local"] = LocalProvider(Path(settings.data_dir), stop_on_close=settings.store_kind == "memory",
                                           confinement=build_confinement(settings), networks=local_networks(policy),
                                           policy_source=policy.source, min_free_bytes=settings.local_min_free_bytes,
                                           max_sandboxes=settings.local_max_sandboxes or host_sandbox_cap())
    if "static" in by_kind:
        instances["static"] = StaticProvider({p: policy.pools[p].upstreams or [] for p in by_kind["static"]})
    if "kubernetes" in by_kind:
        # Imported only when a pool needs it: kubernetes_asyncio is the heaviest import of all.
        from gateway.providers.kubernetes import KubernetesProvider
        from gateway.providers.kubernetes_calls import KubeObserver

        observer = KubeObserver() if metrics is None else KubeObserver(metrics.kube_request, metrics.kube_watch_restart)
        instances["kubernetes"] = KubernetesProvider.from_policy(settings, policy, by_kind["kubernetes"], observer)
    return PoolProviders({name: instances[kind] for kind, names in by_kind.items() for name in names})


def tenant_limits(settings: Settings, policy: Policy) -> str:
    """The tenant limits in force, in one line for the startup log: the admission limits (the org
    limits per replica or, with Redis, for the installation; the proxy's caps) and the store-wide
    sandbox caps of the policy."""

    def limit(value: float | None, unit: str = "") -> str:
        if value is None:
            return "unlimited"
        return f"{value}{unit}" if isinstance(value, int) else f"{value:g}{unit}"

    rate = settings.org_rate_limit
    burst = settings.org_rate_burst if settings.org_rate_burst is not None else max(1, math.ceil(rate or 1))
    per_replica = [f"org rate {limit(rate, '/s')}" + ("" if rate is None else f" (burst {burst})"),
                   f"streams/org {limit(settings.max_streams_per_org)}",
                   f"body {limit(settings.max_body_bytes, ' B')}",
                   f"ws message {limit(settings.ws_max_message_bytes, ' B')}",
                   f"head {settings.max_header_bytes} B in {settings.header_read_timeout:g}s"]
    caps = [f"pool {name} {limit(pool.max_sandboxes)}" for name, pool in policy.pools.items()]
    caps += [f"org {org} {rule.max_sandboxes}" for org, rule in sorted(policy.orgs.items())
             if rule.max_sandboxes is not None]
    scope = "org limits for the installation" if settings.limits_shared else "per replica"
    return f"tenant limits ({scope}): {', '.join(per_replica)}; sandbox caps (store-wide): {', '.join(caps)}"


class Gateway:
    """One serving process: build with :meth:`create`, then :meth:`start` and :meth:`stop`."""

    def __init__(self, settings: Settings, policy: Policy, store: SessionStore | InstrumentedStore, provider: PoolProviders,
                 metrics: Metrics, access: AccessLog | None = None) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.metrics = metrics
        # Teardown, last step first: start() pushes each step's undo as the step succeeds.
        self._teardown = contextlib.AsyncExitStack()
        self._teardown.push_async_callback(store.close)
        view = PolicyView(policy)
        tuning = RouterTuning(route_ttl=settings.route_cache_ttl, route_stale_ttl=settings.route_stale_ttl,
                              session_ttl=settings.session_ttl, lease_seconds=settings.creation_lease,
                              # a pass with a backlog goes on for a few intervals (the next one starts an
                              # interval after it ends): the backlog drains at ~80% of the reaper's pace
                              reap_budget=4 * settings.reap_interval,
                              activity_flush=settings.activity_flush_interval + 0.5)
        self.lifecycle = Lifecycle(store, provider, view,
                                   lease=ReaperLease(store, settings.replica_id, tuning.reaper_lease_ttl),
                                   tuning=tuning, clock=time.time, events=metrics)
        self.router = SessionRouter(store, provider, view, replica_id=settings.replica_id, tuning=tuning,
                                    clock=time.time, events=metrics, lifecycle=self.lifecycle)
        self.authenticator, self.admin = build_auth(settings)
        self.access_tokens = build_access(settings)  # minted by the control API, checked by the data plane
        self._locator: KubernetesSandboxLocator | None = None  # when the router headers are on
        self.compat: RouterCompat | None = None
        if settings.router_compat_namespaces:
            # Imported only when the router headers are on: it needs kubernetes_asyncio (a heavy import).
            from gateway.compat_locator import KubernetesSandboxLocator

            self._locator = KubernetesSandboxLocator(settings.router_compat_api_version, kubeconfig=settings.kubeconfig,
                                                     in_cluster=settings.in_cluster)
            self.compat = RouterCompat(settings.router_compat_namespaces, settings.router_compat_ports, self.admin,
                                       self._locator)
        self.data_plane: DataPlane | None = None  # from start()
        self.grpc_front: GrpcFront | None = None  # when start() is given a gRPC socket
        self._control_runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._policy_mtime: float | None = None
        self._access = access if settings.access_log else None
        self._on_request = self._request_callback(RequestMetrics(metrics))
        self.data_address: tuple[str, int] | None = None
        self.control_address: tuple[str, int] | None = None
        self.grpc_address: tuple[str, int] | None = None
        self.allowed_hosts = AllowedHosts(
            settings.allowed_hosts if settings.allowed_hosts is not None else default_allowed_hosts(settings.host) or [],
            preview_domain=settings.preview_domain, public_url=settings.public_url)

    def _preview_keys(self) -> PreviewKeys | None:
        if self.access_tokens is None:
            return None
        return PreviewKeys(self.access_tokens, domain=self.settings.preview_domain,
                           path_prefix=self.settings.preview_path_prefix,
                           path_cookies=self.settings.preview_path_cookies)

    def _grants(self, data_sock: socket.socket) -> Grants:
        """What the control API mints access tokens and their URLs with (NoGrants without signing keys)."""
        if self.access_tokens is None:
            return NoGrants()
        s = self.settings
        return AccessGrants(self.access_tokens, data_port=data_sock.getsockname()[1], public_url=s.public_url,
                            preview_domain=s.preview_domain, path_prefix=s.preview_path_prefix)

    @classmethod
    def create(cls, settings: Settings, access: AccessLog | None = None) -> Gateway:
        """``access``: where request lines go (``configure_logging`` makes it; None = no access log)."""
        policy = load_policy(settings)
        metrics = Metrics(per_org=settings.per_org_metrics, org_label_limit=settings.org_label_limit,
                          multiprocess_dir=settings.prometheus_multiproc_dir)
        store = InstrumentedStore(build_store(settings), metrics)
        return cls(settings, policy, store, build_providers(settings, policy, metrics), metrics, access)

    async def start(self, data_sock: socket.socket, control_sock: socket.socket,
                    grpc_sock: socket.socket | None = None) -> None:
        """Bring every part up; if one fails, the parts already up are stopped again before the error
        propagates (no provider watch or background loop outlives a failed start)."""
        try:
            await self._start(self._teardown, data_sock, control_sock, grpc_sock)
        except BaseException:
            await self._teardown.aclose()
            raise

    async def _start(self, undo: contextlib.AsyncExitStack, data_sock: socket.socket,
                     control_sock: socket.socket, grpc_sock: socket.socket | None) -> None:
        # The store is closed last (pushed in __init__), then, in the reverse of this order: the
        # locator, the provider, what is left in the access log and the activity batch, the reaper
        # lease, the background loops (they keep beating activity while requests drain), the data plane and
        # the gRPC front (drained together), the control API.
        if self._locator is not None:
            await self._locator.start()
            undo.push_async_callback(self._locator.close)
        await self.provider.start(self.router.sandbox_lost)
        undo.push_async_callback(self.provider.close)
        if self._access is not None:
            undo.callback(self._access.flush)
        undo.push_async_callback(self._flush_activity_once)
        undo.push_async_callback(self.lifecycle.lease.release)  # once no loop can take it again
        self._start_background_loops()
        undo.push_async_callback(self._stop_background_loops)
        bounds = connection_bounds(self.settings.max_connections, self.settings.max_connections_per_client)

        def gate(listener: str) -> ConnectionGate:
            return ConnectionGate(listener, *bounds, on_refused=self.metrics.connection_refused,
                                  on_shed=self.metrics.connection_shed)
        options = plane_options(self.settings)
        if grpc_sock is not None:  # the port really bound (settings may say 0), named to HTTP/2 clients
            options = dataclasses.replace(options, grpc_port=grpc_sock.getsockname()[1])
        plane = self.data_plane = DataPlane(
            self.router, options, on_request=self._on_request, authenticator=self.authenticator,
            limits=self._org_limits(undo), compat=self.compat if self.compat is not None else NoRouterHeaders(),
            keys=self._preview_keys(), hosts=self.allowed_hosts, gate=gate("data"), tracer=self._tracer(undo),
            on_heads_overdue=self.metrics.heads_overdue)
        self.router.view.subscribe(plane.policy_replaced)  # its request timeouts, now and at every reload
        self.metrics.add_fold(self._live_gauges)  # exact at a scrape, not up to 5 s behind
        await plane.start(data_sock)
        undo.push_async_callback(self._drain_fronts)
        if grpc_sock is not None:
            front = self.grpc_front = GrpcFront(
                self.router, self.settings, authenticator=self.authenticator, limits=plane.limits,
                metrics=GrpcMetrics(self.metrics.registry, batching=self.metrics), access=self._access,
                admission=plane.admission, tracer=plane.tracer, gate=gate("grpc"))
            await front.start(grpc_sock)
            self.grpc_address = front.address
        control = create_control_app(self.router, self.readiness, self.metrics, self.admin,
                                     warnings=self._provider_warnings(), grants=self._grants(data_sock),
                                     mcp=McpTarget(self.settings.kagent_mcp_port, self.settings.kagent_mcp_path),
                                     hosts=self.allowed_hosts, suspend_grace=self.settings.suspend_grace)
        self._control_runner = ControlRunner(control, access_log=None, handle_signals=False)
        await self._control_runner.setup()
        undo.push_async_callback(self._control_runner.cleanup)
        await web.SockSite(self._control_runner, control_sock).start()
        self.data_address = data_sock.getsockname()[:2]
        self.control_address = control_sock.getsockname()[:2]

    def _tracer(self, undo: contextlib.AsyncExitStack) -> Tracer | None:
        """The OpenTelemetry tracer (gateway/tracing.py), None when tracing is off; at stop, after the
        fronts have drained, the spans left are exported (off the loop: the exporter blocks)."""
        tracer = Tracer.from_settings(self.settings)
        if tracer is not None:
            undo.push_async_callback(asyncio.to_thread, tracer.shutdown)
        return tracer

    def _org_limits(self, undo: contextlib.AsyncExitStack) -> OrgLimits | SharedOrgLimits:
        """Per-org limits: the installation's (leased from Redis) or, without Redis or when asked, this
        replica's. The shared ones give their stream slots back once the fronts have drained."""
        settings = self.settings
        store = getattr(self.store, "inner", self.store)
        if not settings.limits_shared or not hasattr(store, "limit_ledger"):
            return OrgLimits.from_settings(settings)
        limits = SharedOrgLimits(store.limit_ledger(), rate=settings.org_rate_limit, burst=settings.org_rate_burst,
                                 max_streams=settings.max_streams_per_org)
        undo.push_async_callback(limits.close)
        return limits

    async def stop(self) -> None:
        """Drain: stop accepting, let in-flight requests finish (bounded), leave sandboxes alive.

        Every part is stopped even if stopping another fails; the first such failure is raised
        once all are done."""
        await self._teardown.aclose()

    async def _drain_fronts(self) -> None:
        """The data plane and the gRPC front drain at the same time, each within ``drain_timeout``."""
        fronts: list[DataPlane | GrpcFront | None] = [self.data_plane, self.grpc_front]
        drains = [front.stop(self.settings.drain_timeout) for front in fronts if front is not None]
        results = await asyncio.gather(*drains, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _start_background_loops(self) -> None:
        if self._access is not None:
            self._every(ACCESS_LOG_FLUSH_INTERVAL, self._flush_access_log)
        self._every(self.settings.activity_flush_interval, self.router.flush_activity)
        self._every(self.settings.reap_interval, self._reap)
        self._every(self.lifecycle.tuning.reaper_lease_renew, self.lifecycle.lease.renew, name="renew_reaper_lease")
        self._every(5.0, self._refresh_gauges)
        if self.settings.policy_file is not None:
            self._policy_mtime = self.settings.policy_file.stat().st_mtime
            self._every(2.0, self._reload_policy)

    def _provider_warnings(self) -> list[str]:
        """What ``GET /v1/sandboxes`` tells every caller about this installation's sandboxes."""
        unconfined = sorted(name for name, pool in self.router.view.pools.items() if pool.provider == "local"
                            and isinstance(p := self.provider.for_pool(name), LocalProvider) and not p.confined)
        if not unconfined:
            return []
        return [f"local sandboxes in pools {', '.join(unconfined)} are not confined "
                "(SANDBOX_GATEWAY_LOCAL_UNCONFINED): they see the host, each other and the gateway's ports"]

    async def _stop_background_loops(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Bounded: a client library that swallows a cancellation must not keep the process alive.
            _, stuck = await asyncio.wait(self._tasks, timeout=STOP_TASKS_TIMEOUT)
            for task in stuck:
                log.warning("background task %s did not stop within %gs; leaving it", task.get_name(),
                            STOP_TASKS_TIMEOUT)

    async def _flush_activity_once(self) -> None:
        with contextlib.suppress(GatewayError):
            await self.router.flush_activity()

    async def readiness(self) -> list[str]:
        problems = []
        try:
            await self.store.ping()
        except GatewayError as exc:
            problems.append(f"store: {exc.message}")
        for provider in self.provider.distinct:
            problem = getattr(provider, "readiness_problem", None)
            if problem is not None and (found := problem(self.settings.kube_api_grace)):
                problems.append(found)
        return problems

    def describe(self) -> list[str]:
        policy = self.router.view.policy
        pools = ", ".join(f"{name} ({pool.provider})" for name, pool in policy.pools.items())
        providers = [f"provider: {line}" for line in self.provider.describe()]
        return [f"auth: {self.settings.effective_auth_mode}"
                f"{'' if isinstance(self.admin, AllowAll) else ' (control API needs an admin token)'}",
                f"store: {self.settings.store_kind}", f"policy: {policy.source}", f"pools: {pools}",
                f"per-session orgs: {', '.join(sorted(policy.per_session_orgs)) or '(none)'}", *providers,
                "router headers: " + (f"namespaces {', '.join(self.settings.router_compat_namespaces)}, ports "
                                      f"{', '.join(map(str, self.settings.router_compat_ports))}, admin token"
                                      if self.compat is not None else "off"),
                tenant_limits(self.settings, policy), f"data plane: {_compiled.DESCRIPTION}"]

    # background work ------------------------------------------------------
    def _every(self, interval: float, job: Callable[[], Awaitable[Any]], name: str | None = None) -> None:
        name = name or job.__name__

        async def loop() -> None:
            task = asyncio.current_task()
            # cancelling(): a job whose library swallowed our CancelledError (redis-py can, when a
            # reply lands as the cancel does) still ends the loop instead of sleeping on forever.
            while task is None or not task.cancelling():
                await asyncio.sleep(interval)
                try:
                    await job()
                except GatewayError as exc:
                    log.warning("%s failed: %s", name, exc.message)
                except Exception:
                    log.exception("%s failed", name)

        self._tasks.append(asyncio.create_task(loop(), name=f"every-{name}"))

    async def _flush_access_log(self) -> None:
        self._access.flush()  # type: ignore[union-attr]

    async def _reap(self) -> None:
        for sandbox_id in await self.lifecycle.reap_once():
            log.info("reaped idle sandbox %s", sandbox_id)
        await self.lifecycle.sweep_orphans(self.settings.orphan_grace)

    def _live_gauges(self) -> None:
        """This process's requests in flight and open streams (a stream counts from its response head, declared
        or not); set at every scrape and fold, and by the periodic refresh for the other workers' scrapes."""
        m, plane = self.metrics, self.data_plane
        if plane is not None:
            m.in_flight.set(plane.in_flight)
            m.open_streams.set(plane.open_streams)

    async def _refresh_gauges(self) -> None:
        """Store-wide session and sandbox counts (every replica reports the same; dashboards take max)."""
        m = self.metrics
        self._live_gauges()
        counts = await self.router.fleet_counts()  # kept by the store as it changes: no scan
        for name in self.router.view.pools:
            m.sessions.labels(name).set(counts.sessions.get(name, 0))
            for state in SandboxState:
                m.sandboxes.labels(name, state.value).set(counts.sandboxes.get((name, state), 0))

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
            policy = load_policy(self.settings)
        except PolicyError as exc:
            log.error("policy reload failed, keeping the previous policy:\n%s", exc)
            return
        self.router.view.replace(policy)  # the router, its lifecycle and the data plane all read it
        log.info("policy reloaded from %s", path)

    def _request_callback(self, metrics: RequestMetrics) -> Callable[[RequestLog], None]:
        """The data plane's per-request callback: metrics, and the access line when there is a log."""
        access = self._access
        if access is None:
            return metrics.record
        return RequestHooks(metrics.record, access.log)  # compiled: no Python frame per request
