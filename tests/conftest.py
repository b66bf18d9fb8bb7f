"""Shared fixtures. Every test runs against real sockets and real processes."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.model import Endpoint, ManagedSandbox, SandboxRequest
from gateway.providers.base import LostHandler, ManagedPage, Probe
from tests.fakekube.fixtures import fake_kube, make_fake_kube  # noqa: F401  (fixtures)
from tests.redis_server import redis_process, redis_server, redis_server_factory  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent


class CountingProvider:
    """A hand-written fake ``SandboxProvider``: every sandbox is one fixed endpoint.

    It counts ``ensure`` calls per sandbox ID, can hold creations on a gate (so
    tests can line up concurrent callers), and can be told to fail.
    """

    def __init__(self, endpoint: Endpoint = Endpoint("127.0.0.1", 9)) -> None:
        self.endpoint = endpoint
        self.created: dict[str, int] = {}
        self.deleted: list[str] = []
        self.suspended: list[str] = []
        self.resumed: list[str] = []
        self.gate: asyncio.Event | None = None
        self._started = asyncio.Condition()
        self.fail_with: Exception | None = None
        self.on_lost: LostHandler | None = None

    async def start(self, on_lost: LostHandler) -> None:
        self.on_lost = on_lost

    async def ensure(self, request: SandboxRequest) -> Endpoint:
        self.created[request.sandbox_id] = self.created.get(request.sandbox_id, 0) + 1
        async with self._started:
            self._started.notify_all()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return self.endpoint

    async def wait_started(self, count: int) -> None:
        """Until ``count`` creations have started (e.g. are held at the gate)."""
        async with self._started:
            await self._started.wait_for(lambda: sum(self.created.values()) >= count)

    async def wait_resumed(self, count: int) -> None:
        """Until ``count`` resumes have started (e.g. are held at the gate)."""
        async with self._started:
            await self._started.wait_for(lambda: len(self.resumed) >= count)

    async def delete(self, sandbox_id: str, pool: str) -> None:
        self.deleted.append(sandbox_id)

    async def suspend(self, sandbox_id: str, pool: str) -> None:
        self.suspended.append(sandbox_id)

    async def resume(self, request: SandboxRequest) -> Endpoint:
        self.resumed.append(request.sandbox_id)
        async with self._started:
            self._started.notify_all()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return self.endpoint

    def can_suspend(self, pool: str) -> bool:
        return True

    async def list_managed(self) -> list[ManagedSandbox]:
        return []

    async def managed_page(self, cursor: str | None, limit: int) -> ManagedPage:
        return ManagedPage([], None)

    async def probe(self, sandbox_id: str, pool: str) -> Probe:
        return Probe.UNKNOWN

    async def close(self) -> None:
        return None

    def describe(self) -> str:
        return "counting fake"


@pytest.fixture
def counting_provider() -> CountingProvider:
    return CountingProvider()


@pytest.fixture
async def no_task_leaks() -> AsyncIterator[None]:
    """Fails a test that leaves tasks running on its loop (after every other fixture's teardown)."""
    before = asyncio.all_tasks()
    yield
    leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    assert not leaked, f"tasks leaked: {leaked}"


@pytest.fixture(autouse=True)
def _async_tests_leak_no_tasks(request: pytest.FixtureRequest) -> None:
    """Every async test runs under ``no_task_leaks``; sync tests (some run their own loop) do not.

    Requested first (autouse), so it is torn down last: a task still running once the test's own
    fixtures are gone is a leak. A module whose tests share a wider loop overrides ``no_task_leaks``
    with that loop scope (tests/hostile/conftest.py).
    """
    if inspect.iscoroutinefunction(getattr(request.node, "obj", None)):
        request.getfixturevalue("no_task_leaks")


def python() -> str:
    return sys.executable


# -- cgroups the suite's gateways leave --------------------------------------------------------
# A gateway run as root makes a cgroup per sandbox under one named after its data dir
# (gateway/providers/confine.py), and keeps them while its sandboxes may still run: a gateway the
# tests kill, or one whose store outlives it, leaves them behind, and every test has its own data dir.
# The kernel keeps an empty cgroup until it is removed, so the controller (not an xdist worker: they
# end while others still run) removes, at the end of a run, those made during it that are empty.
def _sandbox_cgroups() -> set[Path]:
    from gateway.providers.confine import own_cgroups

    return {parent for own in own_cgroups().values() for parent in own.glob("sgw-*")}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_CGROUPS_BEFORE] = _sandbox_cgroups()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return
    for parent in _sandbox_cgroups() - session.config.stash.get(_CGROUPS_BEFORE, set()):
        for cgroup in [*parent.iterdir(), parent]:
            if cgroup.is_dir():
                try:
                    cgroup.rmdir()  # refused while a process is in it, or it has children
                except OSError:
                    pass


_CGROUPS_BEFORE = pytest.StashKey[set[Path]]()


# -- one pass only -----------------------------------------------------------------------------
# ./scripts/test runs the suite twice, on the compiled data plane and on its pure-Python modules
# (gateway/_compiled.py). These files exercise nothing of those modules that the per-way tests do not,
# and cost minutes: they run in the first pass only, and the second says so for each. They are chart
# rendering, multi-process scenarios and the browser suites (whose
# data-plane paths the per-way tests cover), and what sits behind the data plane, which is the same
# Python either way: routing (pure and synchronous), the stores, providers and sandboxes (local,
# Kubernetes, the fake apiserver, the runtime), the lifecycle and the reaper, the CLI's refusals. Where
# one of them drives a request through the data plane it is a carrier only: a file that tests what the
# data plane does with a request (tests/test_proxy_*.py, hostile/, the session layer) runs both ways.
ONCE = ("tests/chaos/", "tests/helm/", "tests/test_browser_redteam.py", "tests/test_browser_isolation.py",
        "tests/test_redis_sentinel.py", "tests/test_failover.py",
        "tests/test_replica_limits.py", "tests/test_limit_leases.py", "tests/test_kubernetes_chaos.py",
        "tests/test_kubernetes_faults.py", "tests/test_fakekube_faults.py", "tests/test_bench_harness.py",
        # behind the data plane (see above)
        "tests/test_replicas.py", "tests/test_outbound.py", "tests/test_confinement.py",
        "tests/test_local_bounds.py", "tests/test_local_provider.py", "tests/test_local_spawn.py",
        "tests/test_local_lock.py", "tests/test_pipes.py", "tests/test_host_uids.py", "tests/test_providers.py",
        "tests/test_runtime.py", "tests/test_runtime_limits.py", "tests/test_grpc_runtime.py",
        "tests/test_grpc_local.py", "tests/test_kubernetes.py", "tests/test_kubernetes_suspend.py",
        "tests/test_kubernetes_options.py", "tests/test_fakekube.py", "tests/test_fakekube_controller.py",
        "tests/test_store.py", "tests/test_redis_codec.py", "tests/test_redis_pool.py", "tests/test_redis_reads.py",
        "tests/test_lifecycle_stress.py", "tests/test_lease_fencing.py", "tests/test_reaper_batches.py",
        "tests/test_reaper_lease.py", "tests/test_rendezvous.py", "tests/test_routing_ids.py",
        "tests/test_routing_placement.py", "tests/test_routing_policy.py", "tests/test_routing_reaping.py",
        "tests/test_cli_refusals.py", "tests/test_log_writer.py", "tests/test_settings.py",
        # pip builds a wheel from a copy of the checkout with no C compiler: nothing of the way under test
        "tests/test_compiled.py::test_without_a_c_compiler_the_install_is_pure_python")
SECOND_PASS = "SANDBOX_GATEWAY_TEST_SECOND_PASS"

# -- alone or beside another worker ------------------------------------------------------------
# ./scripts/test runs each pass in two parts: these files with nothing else of the suite running,
# then the rest on two pytest-xdist workers (those tests mostly wait on their subprocesses and
# sockets). These stay alone because they time or load the machine: the chaos storms and the
# neighbours' attacks, latency bounds under thousands of connections, replicas killed or failed
# over under load (Sentinel), rate limits across replicas, lease timings, the benchmark harness,
# h2spec, and the pip build of test_compiled (two cores of C compiling and Cython).
SERIAL = ("tests/chaos/", "tests/test_connection_bounds.py", "tests/test_redis_sentinel.py",
          "tests/test_failover.py", "tests/test_replicas.py", "tests/test_replica_limits.py",
          "tests/test_limit_leases.py", "tests/test_kubernetes_chaos.py", "tests/test_lifecycle_stress.py",
          "tests/test_bench_harness.py", "tests/test_h2spec.py", "tests/test_compiled.py")
PART = "SANDBOX_GATEWAY_TEST_PART"  # "serial" or "parallel": only those tests (unset: all)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under xdist, a worker takes a whole file at a time, so each file runs as in a serial run (its
    module-scoped fixtures once, its tests in order), and tests/hostile/ whole: its gateway is
    package-scoped and its last file (test_zz_afterwards.py) checks what the whole table left behind."""
    from xdist.scheduler import LoadScopeScheduling

    class WholeFiles(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/hostile/" if nodeid.startswith("tests/hostile/") else nodeid.split("::", 1)[0]

    return WholeFiles(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import os

    part = os.environ.get(PART, "")
    if part in ("serial", "parallel"):
        other = [item for item in items if item.nodeid.startswith(SERIAL) != (part == "serial")]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if item.nodeid.startswith(SERIAL) == (part == "serial")]
    if os.environ.get(SECOND_PASS) != "1":
        return
    skip = pytest.mark.skip(reason="run in the first (compiled) pass only: it exercises no data-plane path the "
                                   "per-way tests do not (tests/conftest.py, ONCE)")
    for item in items:
        if item.nodeid.startswith(ONCE):
            item.add_marker(skip)
