"""One chaos run: the cluster, the load, the faults in fixed short phases, a final cleanup, the
report. tests/chaos/test_chaos.py runs it small; benchmarks/soak.py runs it long and big."""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.cluster import Cluster, local_states, provider_store_difference, rss_kb, start_cluster
from tests.chaos.driver import OK, Load, Recorder, Sample, Session, make_sessions
from tests.chaos.faults import Faults

#: An answer a fault caused may arrive this long after the fault was seen to be over: a route
#: cached during the fault (SANDBOX_GATEWAY_ROUTE_CACHE_TTL is 2 s) and requests already queued.
GRACE = 3.0
CONVERGE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Scale:
    isolated: int = 6          # per-session local sandboxes
    shared_users: int = 2      # shared local sandboxes, each used by `per_user` sessions
    per_user: int = 3
    kube: int = 6              # per-session fake-Kubernetes sandboxes
    stalled: int = 1           # sessions on the stalling static pool
    refused: int = 1           # sessions on the refusing static pool
    workers: int = 8
    steady: float = 4.0        # seconds of load before the first fault and after the last
    gap: float = 1.5           # seconds of load between faults
    rounds: int = 1            # times the whole fault sequence runs
    duration: float = 0.0      # seconds: with rounds=0, fault rounds run until this much time has passed
    slow_command: str = "sleep 0.5"


@dataclass
class Report:
    scale: Scale
    requests: int = 0
    ok: int = 0
    errors_expected: dict[str, int] = field(default_factory=dict)
    errors_unexpected: list[Sample] = field(default_factory=list)
    wrong_owner: int = 0
    sessions_lost: int = 0                 # secrets or sandboxes lost outside a fault that may lose them
    sessions_lost_unpersisted: int = 0     # sessions whose secret vanished with Redis back empty
    bindings_lost: dict[str, int] = field(default_factory=dict)
    impostor_answers: dict[int, int] = field(default_factory=dict)
    sessions_taken: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    kube_recreated: dict[str, int] = field(default_factory=dict)
    p99_steady_ms: float = 0.0
    p99_fault_ms: float = 0.0
    heal_seconds: dict[str, float] = field(default_factory=dict)
    rss_growth_kb: dict[str, int] = field(default_factory=dict)
    windows: list[str] = field(default_factory=list)
    started: float = 0.0  # the loop time the load started: sample and window times are shown from it
    started_wall: float = 0.0

    def zeros_hold(self) -> bool:
        persistent_losses = sum(n for name, n in self.bindings_lost.items() if "AOF" in name)
        return not (self.errors_unexpected or self.wrong_owner or self.sessions_lost or persistent_losses
                    or self.duplicated or self.leaked)

    def render(self) -> str:
        started = time.strftime("%H:%M:%S", time.localtime(self.started_wall))
        lines = [f"chaos run from {started} (times below from there): {self.requests} requests, {self.ok} served",
                 f"  errors expected during faults or on standing faulty upstreams: {self.errors_expected or 0}",
                 f"  errors unexpected: {len(self.errors_unexpected)}"]
        for sample in self.errors_unexpected[:20]:
            lines.append(f"    t={sample.t0 - self.started:.2f}s {sample.session} {sample.op} "
                         f"on replica {sample.replica}: {sample.klass}")
        lines += [
            f"  sandboxes given to the wrong owner: {self.wrong_owner}",
            f"  sessions lost: {self.sessions_lost} (with Redis back empty, no persistence: "
            f"{self.sessions_lost_unpersisted})",
            f"  bindings lost per Redis restart: {self.bindings_lost}",
            f"  other identities claiming session IDs after the bindings were lost, answers by status: "
            f"{self.impostor_answers} (any 200 counts as a wrong owner); session IDs taken over with a fresh "
            f"sandbox (the victim's already swept): {len(self.sessions_taken)} {self.sessions_taken or ''}",
            f"  sandboxes duplicated: {len(self.duplicated)} {self.duplicated or ''}",
            f"  sandboxes leaked after cleanup: {len(self.leaked)} {self.leaked or ''}",
            f"  Kubernetes sandboxes re-created (deleted behind the gateway, or swept after Redis came back empty): "
            f"{len(self.kube_recreated)}",
            f"  p99 steady {self.p99_steady_ms:.1f} ms, during faults {self.p99_fault_ms:.1f} ms",
            "  RSS growth per replica: " + ", ".join(f"{k} {v / 1024:+.1f} MiB" for k, v in self.rss_growth_kb.items()),
            "  faults (time to heal):",
        ]
        lines += [f"    {name}" + (f" (healed in {self.heal_seconds[name]:.2f}s)" if name in self.heal_seconds else "")
                  for name in self.windows]
        return "\n".join(lines)


async def run(root: Path, scale: Scale = Scale()) -> Report:
    cluster = await start_cluster(root)
    try:
        return await _run(cluster, scale)
    finally:
        await cluster.close()


async def _run(cluster: Cluster, scale: Scale) -> Report:
    recorder = Recorder()
    sessions = make_sessions(cluster.policy_path, isolated=scale.isolated, shared_users=scale.shared_users,
                             per_user=scale.per_user, kube=scale.kube, stalled=scale.stalled, refused=scale.refused)
    load = Load(cluster, recorder, sessions, workers=scale.workers, slow_command=scale.slow_command)
    standing = [s.session_id for s in sessions if s.kind not in ("local", "kube")]
    if standing:  # not faults of the run: the policy points these pools at hosts that stall or refuse
        recorder.open("standing: static pools that stall (504) and refuse (502)",
                      {"http_504:upstream_timeout", "http_502:upstream_unreachable"}, standing, transient=False)
    await _warm_up(load, sessions)
    for replica in cluster.replicas:
        replica.rss_baseline_kb = rss_kb(replica.pid)
    faults = Faults(cluster, load, recorder)
    recorder.load_started = asyncio.get_running_loop().time()
    load.start()
    try:
        await asyncio.sleep(scale.steady)  # a fixed phase of steady load (the run's baseline)
        began = asyncio.get_running_loop().time()
        round_ = 0
        while round_ < scale.rounds or asyncio.get_running_loop().time() - began < scale.duration:
            await _fault_round(cluster, faults, sessions, round_, scale.gap)
            round_ += 1
        await asyncio.sleep(scale.steady)
    finally:
        await load.stop()
    report = _measure(cluster, recorder, faults, scale)
    report.duplicated = _duplicates(cluster)
    report.kube_recreated = _kube_recreations(cluster)
    report.leaked = await _cleanup_and_leaks(cluster, sessions + faults.log.extra_sessions)
    return report


async def _warm_up(load: Load, sessions: list[Session]) -> None:
    """Every session served once (its sandbox created, its secrets written) before the clock starts."""
    limit = asyncio.Semaphore(4)

    async def one(session: Session) -> None:
        async with limit:
            await load.exercise(session)

    await asyncio.gather(*(one(s) for s in sessions))


async def _fault_round(cluster: Cluster, faults: Faults, sessions: list[Session], round_: int, gap: float) -> None:
    isolated = [s for s in sessions if s.org == "iso"]
    kube = [s for s in sessions if s.kind == "kube"]
    replicas = cluster.replicas
    steps = [
        lambda: faults.kill_replica(replicas[(round_ + 2) % len(replicas)]),
        lambda: faults.restart_redis(persistent=True, outage=1.0),
        lambda: faults.kill_local_sandbox(isolated[round_ % len(isolated)]),
        lambda: faults.kill_local_sandbox_creator_dead(replicas[(round_ + 1) % len(replicas)]),
        lambda: faults.drop_watches(),
        lambda: faults.delete_kube_sandbox(kube[round_ % len(kube)]),
        lambda: faults.delete_kube_sandbox(kube[(round_ + 1) % len(kube)], drop_watches=True),
        lambda: faults.restart_redis(persistent=False, outage=0.5),
    ]
    for step in steps:
        await step()
        await asyncio.sleep(gap)  # a fixed phase of load between faults


def _measure(cluster: Cluster, recorder: Recorder, faults: Faults, scale: Scale) -> Report:
    report = Report(scale)
    report.requests = len(recorder.samples)
    transient = [w for w in recorder.windows if w.transient]
    steady, during = [], []
    for sample in recorder.samples:
        if sample.klass == OK:
            report.ok += 1
            if sample.op in ("whoami", "read", "write") and sample.t0 >= recorder.load_started:
                overlaps = any(sample.t1 >= w.start and sample.t0 <= w.end for w in transient)
                (during if overlaps else steady).append(sample.latency)
            continue
        if sample.klass == "wrong_owner":
            report.wrong_owner += 1
        window = next((w for w in recorder.windows if w.covers(sample, GRACE)), None)
        if window is None:
            report.errors_unexpected.append(sample)
        else:
            report.errors_expected[sample.klass] = report.errors_expected.get(sample.klass, 0) + 1
    report.sessions_lost = len({s.session for s in report.errors_unexpected if s.klass == "secret_missing"})
    unpersisted = [w for w in recorder.windows if "no persistence" in w.name]
    report.sessions_lost_unpersisted = len({s.session for s in recorder.samples if s.klass == "secret_missing"
                                            and any(w.covers(s, GRACE) for w in unpersisted)})
    report.p99_steady_ms = _p99(steady) * 1000
    report.p99_fault_ms = _p99(during) * 1000
    report.bindings_lost = dict(faults.log.bindings_lost)
    report.impostor_answers = dict(faults.log.impostor_answers)
    report.sessions_taken = list(faults.log.sessions_taken)
    report.started = recorder.load_started
    report.started_wall = time.time() - (asyncio.get_running_loop().time() - report.started)
    report.windows = [f"{w.start - report.started:7.2f}s-{w.end - report.started:7.2f}s {w.name}" for w in transient]
    report.heal_seconds = {f"{w.start - report.started:7.2f}s-{w.end - report.started:7.2f}s {w.name}":
                           faults.log.heal_seconds[w.name] for w in transient if w.name in faults.log.heal_seconds}
    for replica in cluster.replicas:
        key = f"replica {replica.index}" + (f" (restarted {replica.restarts}x)" if replica.restarts else "")
        report.rss_growth_kb[key] = rss_kb(replica.pid) - replica.rss_baseline_kb
    return report


def _p99(latencies: list[float]) -> float:
    if not latencies:
        return math.nan
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def _duplicates(cluster: Cluster) -> list[str]:
    """A sandbox running twice: two live process sessions for one local sandbox ID. (A Kubernetes
    sandbox cannot run twice: its object's name is its ID, and the apiserver refuses a second.)"""
    sessions_by_sandbox: dict[str, set[int]] = {}
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        sandbox_id = _runtime_sandbox(pid)
        if sandbox_id is not None:
            try:
                sessions_by_sandbox.setdefault(sandbox_id, set()).add(os.getsid(pid))
            except ProcessLookupError:
                continue
    registry = set(local_states(cluster.registry))
    return [f"local {sid} x{len(s)}" for sid, s in sessions_by_sandbox.items() if sid in registry and len(s) > 1]


def _kube_recreations(cluster: Cluster) -> dict[str, int]:
    """Names the gateway created more than once (after a deliberate delete or an orphan sweep)."""
    server = cluster.kube.server
    names = {c.name for c in server.create_calls if c.plural == "sandboxes"}
    counts = {name: server.create_count("sandboxes", "default", name) for name in names}
    return {name: n for name, n in counts.items() if n > 1}


def _runtime_sandbox(pid: int) -> str | None:
    """The sandbox ID of a reference-runtime process (its argv names it), else None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    if b"gateway.runtime" not in argv:
        return None
    return next((a.decode() for a in argv if a[:4] in (b"ses-", b"org-", b"usr-")), None)


async def _cleanup_and_leaks(cluster: Cluster, sessions: list[Session]) -> list[str]:
    """Every session deleted through the API; then, once the orphan sweep has had its grace, the
    provider's view (live local runtimes, fake-apiserver objects) must equal the store's."""
    assert cluster.http is not None
    replica = cluster.live()[0]
    for session in sessions:
        async with cluster.http.delete(f"{replica.process.control_url}/v1/sessions/{session.session_id}",
                                       headers=session.headers) as response:
            assert response.status in (200, 404), (session, response.status, await response.text())
    deadline = asyncio.get_running_loop().time() + CONVERGE_TIMEOUT
    while (leaked := await provider_store_difference(cluster)) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.5)  # the orphan sweep runs on its own interval: no event to await
    return leaked
