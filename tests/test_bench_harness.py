"""The benchmarks' harness: what it reports about the machine, the CPU it attributes, the peers it starts.

A figure from ``benchmarks/`` is only as good as what is printed beside it, so these check the
parts a reader relies on: the header names the build the gateway runs, each process's CPU lands
on its own role, ``proxy_bench --serve`` with several workers gets a Redis of its own, and the
nginx ``grpc_pass`` peer of ``grpc_bench`` really relays gRPC. Real processes, no stand-ins.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from grpclib.client import Channel
from grpclib.const import Cardinality

import gateway._compiled
from benchmarks import grpc_bench, harness, proxy_bench, pyspy_profile
from tests.grpc_helpers import RawCodec, echo_server
from tests.redis_server import redis_server_path

BUSY = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"


def test_header_names_the_machine_the_build_and_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "_BUILD_AT_START", {})
    lines = harness.header("bench").splitlines()
    fields = dict(line.split(":", 1) for line in lines[1:])
    assert set(fields) >= {"cpu", "cores", "frequency", "kernel", "python", "build", "load average"}
    # The build is asked of a fresh interpreter started like the gateway: the same choice as this one's.
    assert fields["build"].strip().startswith(gateway._compiled.DESCRIPTION.split(" (")[0])
    assert str(harness.ROOT / "gateway") in fields["build"]
    assert "before the run" in fields["load average"]
    assert "after the run" in harness.footer()


def test_footer_warns_when_the_build_changed_during_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiled module edited mid-run makes later gateway processes pure Python under a header that said
    compiled: the footer asks again and says so. Here the change is the switch that forces pure Python."""
    monkeypatch.setattr(harness, "_BUILD_AT_START", {})
    monkeypatch.setenv(gateway._compiled.PURE_PYTHON_ENV, "0")
    harness.header("bench")
    if harness._BUILD_AT_START[False].startswith("pure Python"):
        pytest.skip(f"no compiled build to change from: {harness._BUILD_AT_START[False]}")
    assert "CHANGED" not in harness.footer()
    monkeypatch.setenv(gateway._compiled.PURE_PYTHON_ENV, "1")
    footer = harness.footer()
    assert "build:        CHANGED during the run" in footer and "run again" in footer, footer


def test_pure_python_build_is_reported_when_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gateway._compiled.PURE_PYTHON_ENV, "1")
    assert harness.gateway_build().startswith("pure Python")


def test_cpu_meter_puts_each_process_cpu_on_its_role() -> None:
    """A busy process and an idle one measured by PID, the load generator as a child run within."""
    busy = subprocess.Popen([sys.executable, "-c", BUSY + "time.sleep(30)"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE)
    try:
        # Measured from its start-up's end: an interpreter's start-up alone is about 20 ms of CPU on a slow
        # machine (20 us over 1000 ops, this bound), which is not what "idle" is about.
        assert idle.stdout is not None and idle.stdout.readline() == b"started\n"
        meter = harness.CpuMeter({"busy": [busy.pid], "idle": [idle.pid]}, harness.LOAD_CHILD, "load")
        with meter:
            subprocess.run([sys.executable, "-c", BUSY], check=True)  # the load generator (wrk's place)
            busy_end = 0.0
            while busy_end < 0.3:  # until the busy one has spent its 0.3 s of CPU, however loaded the machine
                busy_end = harness.cpu_ns([busy.pid])[0] / 1e9
        cpu = meter.per_op(1000)
    finally:
        harness.stop_procs([busy, idle])
        if idle.stdout is not None:
            idle.stdout.close()
    assert set(cpu) == {"busy", "idle", "load"}
    # 0.3 s of CPU over 1000 ops: 300 us per op each (the interpreter's start-up adds to both)
    assert cpu["load"].us >= 290
    assert cpu["busy"].us >= 200
    assert cpu["idle"].us < 20
    assert 0 <= cpu["load"].sys_us <= cpu["load"].us


@pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed")
def test_serve_with_workers_gets_a_redis_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """It died with KeyError: 'BENCH_REDIS_URL'; now it starts redis-server on a port the kernel chose."""
    monkeypatch.delenv("BENCH_REDIS_URL", raising=False)
    with contextlib.ExitStack() as stack:
        url, pids = proxy_bench.bench_redis(stack)
        with redis.Redis.from_url(url, socket_timeout=5) as client:
            assert client.ping()
        assert len(pids) == 1 and os.path.exists(f"/proc/{pids[0]}")
    with pytest.raises(redis.ConnectionError), redis.Redis.from_url(url, socket_timeout=5) as client:
        client.ping()  # stopped with the run


def test_serve_with_workers_uses_bench_redis_url_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_REDIS_URL", "redis://127.0.0.1:1/0")
    with contextlib.ExitStack() as stack:
        assert proxy_bench.bench_redis(stack) == ("redis://127.0.0.1:1/0", [])


@pytest.mark.skipif(harness.NGINX is None, reason="nginx is not installed")
async def test_nginx_grpc_peer_relays_calls(tmp_path: Path) -> None:
    """More calls than nginx 1.22's default keepalive_requests (1000) on one client connection, all answered,
    with the upstream pool kept (keepalive) and neither side's connection ended at 1000 requests."""
    async with echo_server() as (_, sandbox_port):
        nginx, port = grpc_bench.start_nginx_grpc(tmp_path, sandbox_port)
        try:
            conf = (tmp_path / "grpc.conf").read_text()
            assert "keepalive 32;" in conf and "grpc_pass grpc://sandbox;" in conf and " http2 " in conf
            assert "keepalive_requests 1000000;" in conf  # upstream
            assert "keepalive_requests 10000000;" in conf  # clients
            channel = Channel("127.0.0.1", port, codec=RawCodec())
            try:
                for i in range(1100):
                    async with channel.request("/test.Echo/Unary", Cardinality.UNARY_UNARY, bytes, bytes) as call:
                        await call.send_message(b"m%d" % i, end=True)
                        assert await call.recv_message() == b"m%d" % i
                        await call.recv_trailing_metadata()
                        assert call.trailing_metadata is not None
            finally:
                channel.close()
        finally:
            harness.stop_procs([nginx])


def test_profile_breakdown_splits_the_measured_user_cpu_and_leaves_syscalls_out(tmp_path: Path) -> None:
    """py-spy samples wall clock: a sample inside write() is the kernel's (measured as stime), not the caller's."""
    stacks = tmp_path / "gateway.txt"
    stacks.write_text(
        "run (uvloop/loop.pyx:1);begin (gateway/proxy/_downstream.py:10) 30\n"
        "run (uvloop/loop.pyx:1);finished (gateway/proxy/_plane.py:20) 10\n"
        "run (uvloop/loop.pyx:1);begin (gateway/proxy/_downstream.py:10);write (libc.so) 60\n"
        "run (uvloop/loop.pyx:1);data_received (gateway/proxy/_downstream.py:5);llhttp_execute (parser.c) 10\n")
    rows = dict(pyspy_profile.breakdown(stacks, user_us=10.0))
    assert rows == {"begin (gateway/proxy/_downstream.py)": 6.0, "finished (gateway/proxy/_plane.py)": 2.0,
                    "[parser: llhttp/httptools]": 2.0}


def test_neighbours_rounds_give_the_median_of_each_rounds_own_ratio() -> None:
    """``neighbours.py --rounds N``: a row's ratio is the median of the rounds' ratios, each against the baseline
    taken around that round (not the ratio of two medians), and every round's ratio is listed."""
    from benchmarks.neighbours import Result, Row, rounds_of, table

    def row(p99: float, base: float, errors: int = 0) -> Row:
        return Row("data-idle", "held", {"data plane": Result(1.0, p99, errors, 100)}, (1.0, 1.0, 1.0),
                   before={"data plane": Result(1.0, base, 0, 200)})

    combined = rounds_of([row(10.0, 2.0), row(3.0, 3.0, errors=1), row(4.0, 1.0)])  # ratios 5, 1, 4
    assert combined.ratios == {"data plane": [5.0, 1.0, 4.0]}
    assert combined.results["data plane"].p99 == 4.0 and combined.before["data plane"].p99 == 2.0
    assert combined.results["data plane"].errors == 1 and combined.results["data plane"].calls == 300
    printed = table([combined])
    assert "| 4.00 (median of 3) |" in printed and "1/300" in printed
    assert "p99 ratio per round: data plane 5.00, 1.00, 4.00" in printed


def test_idle_churn_reports_cpu_per_idle_connection_on_both_ports() -> None:
    """benchmarks/idle_churn.py against a real serve and real attackers, small: both ports close idle connections
    at their deadline, and each line says what one cost the gateway."""
    done = subprocess.run([sys.executable, "benchmarks/idle_churn.py", "--connections", "40", "--sources", "2",
                           "--deadline", "0.3", "--seconds", "1.5"], cwd=harness.ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "closed at their deadline" in line]
    assert [line.split()[0] for line in lines] == ["grpc", "data"], done.stdout
    assert all(line.endswith(" us per connection") for line in lines), done.stdout


def test_head_wave_reports_the_closes_at_the_head_deadline_each_second() -> None:
    """benchmarks/head_wave.py against a real serve and real slowloris attackers, small: heads are closed at their
    deadline and counted each second, and the loop thread's CPU is reported."""
    done = subprocess.run([sys.executable, "benchmarks/head_wave.py", "--connections", "40", "--sources", "2",
                           "--timeout", "0.5", "--warm", "1", "--seconds", "2"], cwd=harness.ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    each = next(line for line in done.stdout.splitlines() if line.startswith("head timeouts, each second: "))
    counts = [int(x) for x in each.rsplit(": ", 1)[1].split()]
    assert len(counts) == 2 and sum(counts) > 0, done.stdout  # 40 connections closed every 0.5-0.6 s
    assert "loop thread CPU per second: mean " in done.stdout, done.stdout


def test_cpu_cap_holds_its_processes_to_the_quota_and_is_removed_after() -> None:
    """benchmarks/placement.CpuCap (neighbours.py's attackers): a busy process that joined the group gets at most
    the quota, the kernel counts the periods it was held back, and the group is gone when the ``with`` ends,
    even with a process still in it."""
    from benchmarks.placement import CpuCap, own_cpu_cgroup

    if own_cpu_cgroup() is None:
        pytest.skip("no writable cgroup v1 cpu hierarchy (root and /sys/fs/cgroup/cpu)")
    with CpuCap(0.2) as cap:
        assert cap.group is not None and (cap.group / "cpu.cfs_quota_us").read_text().strip() == "20000"
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=cap.join)
        try:
            assert (cap.group / "cgroup.procs").read_text().split() == [str(busy.pid)]
            started, cpu = time.monotonic(), harness.cpu_ns([busy.pid])[0]
            deadline = started + 30
            while cap.stat()["nr_throttled"] < 5 and time.monotonic() < deadline:
                time.sleep(0.05)  # cgroup v1 has no event for a throttled period
            used, elapsed = (harness.cpu_ns([busy.pid])[0] - cpu) / 1e9, time.monotonic() - started
            assert cap.stat()["nr_throttled"] >= 5
            assert used <= 0.2 * elapsed + 0.1, (used, elapsed)  # uncapped it would be ~1.0 x elapsed
            group = cap.group
        finally:
            busy.kill()
            busy.wait()
        idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=cap.join)
    try:
        assert not group.exists()  # removed, its process moved to the parent group
        assert str(idle.pid) in (group.parent / "cgroup.procs").read_text().split()
    finally:
        idle.kill()
        idle.wait()


def test_cpu_cap_is_removed_on_failure_and_a_killed_runs_group_by_the_next() -> None:
    from benchmarks.placement import PREFIX, CpuCap, own_cpu_cgroup

    parent = own_cpu_cgroup()
    if parent is None:
        pytest.skip("no writable cgroup v1 cpu hierarchy (root and /sys/fs/cgroup/cpu)")
    with pytest.raises(RuntimeError, match="the run failed"), CpuCap(0.5, held=False) as cap:
        group = cap.group
        assert group is not None and (group / "cpu.cfs_quota_us").read_text().strip() == "-1"
        with pytest.raises(RuntimeError, match="the attack failed"), cap.holding():
            assert (group / "cpu.cfs_quota_us").read_text().strip() == "50000"
            raise RuntimeError("the attack failed")
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "-1"  # uncapped for the attack's end
        raise RuntimeError("the run failed")
    assert group is not None and not group.exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = parent / f"{PREFIX}{dead.pid}-0"  # what a run killed with SIGKILL leaves behind
    left.mkdir()
    try:
        with CpuCap(0.5) as cap:
            assert not left.exists() and cap.group is not None and cap.group.exists()
    finally:
        if left.exists():
            left.rmdir()
    assert CpuCap(0).group is None and CpuCap(0).describe() == "attackers uncapped"


async def test_neighbours_victim_calls_its_ports_in_turn() -> None:
    """The victim's ports are called one after another, call by call (not each in a block of its own), so a
    periodic cost of the gateway lands on every port alike; a port asked for every Nth turn gets a call then."""
    from benchmarks.neighbours import measure

    order: list[str] = []

    def port(name: str) -> Any:
        async def call() -> None:
            order.append(name)
            if name == "b" and order.count("b") == 2:
                raise ConnectionResetError("refused")
        return call

    results = await measure(4, {"a": port("a"), "b": port("b"), "c": port("c")}, {"c": 2})
    assert order == ["a", "b", "c", "a", "b", "a", "b", "c", "a", "b"]
    assert [results[p].calls for p in "abc"] == [4, 4, 2]
    assert results["b"].errors == 1 and "refused" in results["b"].first_error and len(results["b"].latencies) == 3
