"""The system under chaos: 3 ``serve`` replicas on one real redis-server, with local sandboxes
(one shared registry, as replicas on one host have), fake-Kubernetes sandboxes (the fake
apiserver and controller in this process, reached by the replicas through a kubeconfig) and two
static pools whose upstream stalls or refuses.

Every wait here is on an event: a replica's "serving" log line then ``/readyz``, Redis's PING, a
watch count at the fake apiserver. Polling remains only where the thing under test has no event to
offer (``/readyz`` turning 200 again after an outage).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from tests.fakekube.fixtures import FakeKube, start_fake_kube
from tests.gateway_process import GatewayProcess
from tests.redis_server import RedisServer

NAMESPACE = "default"
POD_TEMPLATE = {"spec": {"containers": [{"name": "runtime", "image": "sandbox-runtime:latest"}]}}

# The orgs the driver's sessions belong to and what each exercises.
LOCAL_ISOLATED = "iso"      # per-session local sandboxes (ses-), the small pool
LOCAL_SHARED = "team"       # shared local sandboxes (org-), one per user
KUBE = "kube"               # per-session sandboxes in the fake cluster
STALL = "stall"             # a static pool whose one host accepts and never answers
REFUSED = "refused"         # a static pool whose one host refuses connections


def policy_document(pods_port: int, stall_url: str, refused_url: str) -> dict[str, Any]:
    kube = {"namespace": NAMESPACE, "api_version": "v1beta1", "mode": "sandbox", "port": pods_port,
            "pod_template": POD_TEMPLATE}
    return {
        "pools": {
            "small": {"provider": "local", "idle_timeout": "1h"},
            "shared": {"provider": "local", "idle_timeout": "1h"},
            "kube": {"provider": "kubernetes", "kubernetes": kube, "idle_timeout": "1h"},
            "stall": {"provider": "static", "upstreams": [stall_url]},
            "refused": {"provider": "static", "upstreams": [refused_url]},
        },
        "routing": {"per_session_orgs": [LOCAL_ISOLATED], "prefix_pools": {"ses": "small", "default": "shared"}},
        "orgs": {KUBE: {"isolation": "per_session", "pool": "kube"}, STALL: {"pool": "stall"},
                 REFUSED: {"pool": "refused"}},
    }


class FakePods:
    """Every fake-cluster pod answers at 127.0.0.1:<port> (the fake controller's pod IP): this one
    server plays them all, each sandbox with its own files, told apart by the ``X-Sandbox-Id`` the
    gateway adds. A sandbox whose object is gone from the apiserver answers 503 ``pod_gone``, as a
    deleted pod stops answering. It speaks the slice of the runtime API the driver uses."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.files: dict[str, dict[str, bytes]] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/", self._health)
        app.router.add_post("/upload", self._upload)
        app.router.add_get("/download/{path:.+}", self._download)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _sandbox(self, request: web.Request) -> str:
        sandbox_id = request.headers.get("X-Sandbox-Id", "")
        if self.kube.server.get_object("sandboxes", NAMESPACE, sandbox_id) is None:
            raise web.HTTPServiceUnavailable(text=json.dumps({"error": {"code": "pod_gone", "message": sandbox_id}}),
                                             content_type="application/json")
        return sandbox_id

    @staticmethod
    def _stamp(response: web.Response, sandbox_id: str) -> web.Response:
        response.headers["X-Runtime-Sandbox-Id"] = sandbox_id
        return response

    async def _health(self, request: web.Request) -> web.Response:
        sandbox_id = self._sandbox(request)
        return self._stamp(web.json_response({"status": "ok", "sandbox_id": sandbox_id}), sandbox_id)

    async def _upload(self, request: web.Request) -> web.Response:
        sandbox_id = self._sandbox(request)
        reader = await request.multipart()
        part = await reader.next()
        assert isinstance(part, aiohttp.BodyPartReader) and part.filename
        self.files.setdefault(sandbox_id, {})[part.filename] = await part.read()
        return self._stamp(web.json_response({"path": part.filename}), sandbox_id)

    async def _download(self, request: web.Request) -> web.Response:
        sandbox_id = self._sandbox(request)
        body = self.files.get(sandbox_id, {}).get(request.match_info["path"])
        if body is None:
            return self._stamp(web.json_response({"error": {"code": "not_found", "message": "no file"}}, status=404),
                               sandbox_id)
        return self._stamp(web.Response(body=body), sandbox_id)


class StallServer:
    """Accepts connections, reads whatever arrives, never answers: an upstream that hangs."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await reader.read(65536):
                pass
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await self._server.wait_closed()


@dataclass
class Replica:
    index: int
    process: GatewayProcess
    up: bool = True
    rss_baseline_kb: int = 0
    restarts: int = 0

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid


@dataclass
class Cluster:
    root: Path
    redis: RedisServer
    kube: FakeKube
    pods: FakePods
    stall: StallServer
    policy_path: Path
    env: dict[str, str]
    replicas: list[Replica] = field(default_factory=list)
    http: aiohttp.ClientSession | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"  # shared by every replica: one host's local registry

    @property
    def registry(self) -> Path:
        return self.data_dir / "sandboxes"

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.up]

    def _process(self, index: int) -> GatewayProcess:
        return GatewayProcess(self.root / f"gw{index}", "--redis-url", self.redis.url, "--data-dir", str(self.data_dir),
                              "--policy", str(self.policy_path),
                              env={**self.env, "SANDBOX_GATEWAY_REPLICA_ID": f"replica-{index}"})

    async def start_replicas(self, count: int) -> None:
        processes = [self._process(i) for i in range(count)]
        await asyncio.gather(*(p.start() for p in processes))
        self.replicas = [Replica(i, p) for i, p in enumerate(processes)]
        await asyncio.gather(*(self.wait_ready(r) for r in self.replicas))

    async def wait_ready(self, replica: Replica, timeout: float = 60.0) -> None:
        """Until the replica's /readyz answers 200 (it has no event to await: the endpoint is the signal)."""
        assert self.http is not None
        async with asyncio.timeout(timeout):
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with self.http.get(f"{replica.process.control_url}/readyz") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)

    async def wait_all_ready(self, timeout: float = 60.0) -> None:
        await asyncio.gather(*(self.wait_ready(r, timeout) for r in self.live()))

    async def kill_replica(self, replica: Replica) -> None:
        """SIGKILL: no drain, no goodbye. The driver stops sending to it first, as a load balancer would."""
        replica.up = False
        assert replica.process.proc is not None
        replica.process.proc.send_signal(signal.SIGKILL)
        await replica.process.proc.wait()
        await replica.process.stop()  # collects the log reader

    def _keep_log(self, replica: Replica) -> None:
        with open(self.root / f"gw{replica.index}.log", "a") as log:
            log.write("\n".join(replica.process.log) + "\n")

    async def restart_replica(self, replica: Replica) -> None:
        self._keep_log(replica)
        replica.process = await self._process(replica.index).start()
        await self.wait_ready(replica)
        replica.restarts += 1
        replica.rss_baseline_kb = rss_kb(replica.pid)
        replica.up = True

    async def restart_redis(self, *, persistent: bool, outage: float = 0.0) -> None:
        """SIGKILL Redis; with ``persistent`` it comes back from its AOF (fsync always: nothing
        acknowledged is lost), without it its files are wiped first: it comes back empty, as a Redis
        without persistence does. ``outage`` keeps it down that long under load."""
        await asyncio.to_thread(self.redis.stop, kill=True)
        if not persistent:
            for entry in self.redis.directory.iterdir():
                if entry.name != "redis.log":
                    shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink()
        if outage:
            await asyncio.sleep(outage)  # the fault's length itself: there is no event to wait for
        await asyncio.to_thread(self.redis.start)  # returns once PING answers (AOF loaded)

    async def close(self) -> None:
        for replica in self.replicas:
            if replica.process.proc is not None and replica.process.proc.returncode is None:
                with contextlib.suppress(AssertionError):
                    await replica.process.stop(timeout=30)
            self._keep_log(replica)
        kill_local_sandboxes(self.registry)
        if self.http is not None:
            await self.http.close()
        await self.pods.stop()
        await self.stall.stop()
        await self.kube.close()
        self.redis.close()


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def local_states(registry: Path) -> dict[str, dict[str, Any]]:
    states = {}
    for state in registry.glob("*/state.json"):
        with contextlib.suppress(OSError, ValueError):
            states[state.parent.name] = json.loads(state.read_text())
    return states


def kill_local_sandboxes(registry: Path) -> None:
    """Sandboxes outlive a Redis-backed gateway by design; the run tears them down itself."""
    for state in local_states(registry).values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(state["pid"], signal.SIGKILL)


async def start_cluster(root: Path, *, replicas: int = 3, extra_env: dict[str, str] | None = None) -> Cluster:
    root.mkdir(parents=True, exist_ok=True)
    redis = RedisServer(appendonly=True)
    redis.start()
    kube = await start_fake_kube(root, ready_delay=0.05)
    pods = FakePods(kube)
    stall = StallServer()
    await pods.start()
    await stall.start()
    refused_port = _closed_port()
    policy_path = root / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy_document(pods.port, f"http://127.0.0.1:{stall.port}",
                                                          f"http://127.0.0.1:{refused_port}")))
    env = {
        "SANDBOX_GATEWAY_KUBECONFIG": str(kube.kubeconfig_path),
        "SANDBOX_GATEWAY_INSTALLATION": "chaos",
        "SANDBOX_GATEWAY_ROUTE_CACHE_TTL": "2",
        "SANDBOX_GATEWAY_DRAIN_TIMEOUT": "2",
        # The stalling pool's 504 comes after this; a loaded CI machine must never take this long otherwise.
        "SANDBOX_GATEWAY_UPSTREAM_READ_TIMEOUT": "8",
        "SANDBOX_GATEWAY_UPSTREAM_CONNECT_TIMEOUT": "2",
        "SANDBOX_GATEWAY_CREATION_LEASE": "20",
        "SANDBOX_GATEWAY_REAP_INTERVAL": "1",
        "SANDBOX_GATEWAY_ORPHAN_GRACE": "5",
        "SANDBOX_GATEWAY_ACCESS_LOG": "false",
        # Every simulated client here comes from 127.0.0.1: the per-address bound derived from a 20,000
        # descriptor limit (500) would count a thousand users as one neighbour (gateway/gate.py).
        "SANDBOX_GATEWAY_MAX_CONNECTIONS_PER_CLIENT": "4000",
        **(extra_env or {}),
    }
    cluster = Cluster(root, redis, kube, pods, stall, policy_path, env,
                      http=aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
    try:
        await cluster.start_replicas(replicas)
    except BaseException:
        await cluster.close()
        raise
    return cluster


def _closed_port() -> int:
    """A port nothing listens on (bound then released: connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def provider_store_difference(cluster: Cluster) -> list[str]:
    """Sandboxes the provider runs that the store does not know, and the reverse (empty: they agree)."""
    stored = await _store_view(cluster)
    provided = {sid for sid, state in local_states(cluster.registry).items() if _runtime_alive(state["pid"], sid)}
    provided |= {o["metadata"]["name"] for o in cluster.kube.server.list_objects("sandboxes", "default")}
    return sorted([f"{sid} (at the provider only)" for sid in provided - stored] +
                  [f"{sid} (in the store only)" for sid in stored - provided])


async def _store_view(cluster: Cluster) -> set[str]:
    assert cluster.http is not None
    replica = cluster.live()[0]
    found: set[str] = set()
    cursor: str | None = None
    while True:
        params = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
        async with cluster.http.get(f"{replica.process.control_url}/v1/sandboxes", params=params) as response:
            page = await response.json()
        found |= {s["sandbox_id"] for s in page["sandboxes"] if s["pool"] in ("small", "shared", "kube")
                  and s["state"] in ("creating", "ready")}
        cursor = page["next_cursor"]
        if cursor is None:
            return found


def _runtime_alive(pid: int, sandbox_id: str) -> bool:
    """The local provider's own test: the registry's pid runs and is that sandbox's (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return sandbox_id.encode() in f.read()
    except OSError:
        return False
