"""What every benchmark shares: the machine and build it ran on, the CPU each process spent, nginx.

A throughput figure is only comparable with another taken on the same CPU model, clock, kernel,
build (compiled or pure Python) and load, and even then it moves with whatever else the machine
runs; the CPU time each process spends per operation moves far less. So a benchmark prints
``header()`` before it starts (machine, build, load average before), measures every process of
the run with ``CpuMeter`` (the proxy, its peer, the backend and the load generator), and prints
``footer()`` (the load average after) at the end.

Also here: loopback ports chosen by the kernel (``free_port``), and nginx started from a
config written to a temp dir (``start_nginx``), used as the reverse proxy and gRPC peer.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
NGINX_INSTALL = "apt-get install nginx (Debian's nginx; it runs as the current user from a temp dir)"


def free_port() -> int:
    """A loopback port the kernel chose (bound to port 0, then released for the server to take)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


# -- the machine and the build ----------------------------------------------------
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where it is not readable)."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def _frequency(info: dict[str, str]) -> str:
    """The clock: cpuinfo's current MHz, and cpufreq's range where the kernel exposes it (not in most VMs)."""
    parts = []
    if "cpu MHz" in info:
        parts.append(f"{float(info['cpu MHz']):.0f} MHz now (cpuinfo)")
    freq = Path("/sys/devices/system/cpu/cpu0/cpufreq")
    with contextlib.suppress(OSError, ValueError):
        low, high = (int((freq / name).read_text()) // 1000 for name in ("cpuinfo_min_freq", "cpuinfo_max_freq"))
        governor = (freq / "scaling_governor").read_text().strip()
        parts.append(f"{low}-{high} MHz, governor {governor} (cpufreq)")
    return ", ".join(parts) or "not readable"


def cpu_model() -> str:
    info = _cpuinfo()
    model = info.get("model name") or info.get("Model") or platform.processor() or "unknown"
    detail = [f"{key} {info[key]}" for key in ("cpu family", "model", "stepping") if key in info]
    if "hypervisor" in info.get("flags", "").split():
        detail.append("virtual machine")
    return model + (f" ({', '.join(detail)})" if detail else "")


def gateway_build(*, installed: bool = False, checkout: Path | None = None) -> str:
    """The data plane the gateway processes will run: what ``gateway._compiled`` chooses in a fresh process.

    Asked of a child started like the gateway (same interpreter and environment) rather than of this
    process, which may not import the gateway at all. ``installed``: the gateway is started as
    ``python -m gateway.cli`` from elsewhere (``serve``), so it is the package the interpreter has
    installed, not necessarily this checkout; else it is this checkout (``ROOT`` first on the path).
    Says which directory the package came from. ``checkout``: that directory's package (first on the path).
    """
    probe = ("import sys; sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None; "
             "import gateway, gateway._compiled as c; print(c.DESCRIPTION + ', from ' + gateway.__path__[0])")
    done = subprocess.run([sys.executable, "-c", probe, str(checkout) if checkout else "" if installed else str(ROOT)],
                          cwd="/",
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or f"unknown ({done.stderr.strip().splitlines()[-1:] or 'no output'})"


def loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "not readable"


# The build each header named, by ``installed``: the footer asks again. A compiled module edited during a run
# makes every gateway process started after that run pure Python (gateway/_compiled.py), under a header that
# still says compiled.
_BUILD_AT_START: dict[bool, str] = {}


def header(name: str, *extra: str, installed: bool = False) -> str:
    """The lines a reader needs to trust the figures below them; print before the run starts.

    ``installed``: the gateway runs as the installed package (``python -m gateway.cli``), see
    ``gateway_build``.
    """
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    build = _BUILD_AT_START[installed] = gateway_build(installed=installed)
    lines = [
        f"== {name}",
        f"cpu:          {cpu_model()}",
        f"cores:        {os.cpu_count()} online, {usable} usable by this process",
        f"frequency:    {_frequency(_cpuinfo())}",
        f"kernel:       {platform.system()} {platform.release()}",
        f"python:       {platform.python_implementation()} {platform.python_version()}",
        f"build:        {build}",
        f"nginx:        {nginx_version()}",
        f"load average: {loadavg()} (1/5/15 min, before the run)",
        *extra,
    ]
    return "\n".join(lines)


def footer() -> str:
    """The load average after the run; and, if the build changed since the header, a warning not to use the
    figures (processes started before and after the change ran different code)."""
    lines = [f"load average: {loadavg()} (1/5/15 min, after the run)"]
    for installed, before in _BUILD_AT_START.items():
        now = gateway_build(installed=installed)
        if now != before:
            lines.append(f"build:        CHANGED during the run, from {before!r} to {now!r}: the figures may mix "
                         "both; run again")
    return "\n".join(lines)


@contextlib.contextmanager
def reported(name: str, *extra: str, installed: bool = False) -> Iterator[None]:
    """``header`` before the body, ``footer`` after it: for benchmarks with nothing else to add."""
    print(header(name, *extra, installed=installed), flush=True)
    yield
    print(footer(), flush=True)


def nginx_version() -> str:
    if NGINX is None:
        return f"not installed ({NGINX_INSTALL})"
    done = subprocess.run([NGINX, "-v"], capture_output=True, text=True, check=False)
    return (done.stderr or done.stdout).strip().removeprefix("nginx version: ")


# -- CPU per operation ------------------------------------------------------------
TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``serve --workers N`` forks; nginx has a master and workers)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{tid}/children") as f:
                    todo += [int(child) for child in f.read().split()]
    return pids


def cpu_ns(pids: list[int]) -> tuple[float, float]:
    """Nanoseconds on CPU summed over every thread of ``pids``, and the kernel's part of it.

    The total is schedstat's first field per thread (exact, in ns) where the kernel has schedstats,
    else ``/proc/PID/stat`` utime+stime (clock ticks); the kernel part is always stime (ticks: good
    over a run of seconds).
    """
    total = 0.0
    system = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            utime, stime = int(fields[11]) * TICK_NS, int(fields[12]) * TICK_NS  # fields 14 and 15
            system += stime
            try:
                exact = 0
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        exact += int(f.read().split()[0])
                total += exact
            except OSError:
                total += utime + stime
    return total, system


def _rusage_ns(who: int) -> tuple[float, float]:
    usage = resource.getrusage(who)
    return (usage.ru_utime + usage.ru_stime) * 1e9, usage.ru_stime * 1e9


@dataclass(frozen=True)
class Cpu:
    """CPU one process (tree) spent per operation, in microseconds, and the kernel's part of it."""

    us: float
    sys_us: float

    def __str__(self) -> str:
        return f"{self.us:.1f} ({self.sys_us:.0f})"

    @staticmethod
    def median(samples: list[Cpu]) -> Cpu | None:
        if not samples:
            return None
        return sorted(samples, key=lambda cpu: cpu.us)[len(samples) // 2]


LOAD_CHILD = "child"  # the load generator is a child this process waits for (wrk, h2load)
LOAD_SELF = "self"    # the load generator runs in this process (aiohttp, grpclib)


class CpuMeter:
    """The CPU every process of one load run spent, per operation: ``with meter: run()``, then ``per_op(n)``.

    ``processes`` names each measured process by its role (``gateway``, ``nginx``, ``backend``,
    ``sandbox``, ...) with the root PIDs of its tree; the load generator is measured too, as
    ``load`` under the name ``load_name``: by ``getrusage(RUSAGE_CHILDREN)`` when it is a child
    that exits within the run (``LOAD_CHILD``: wrk), or ``RUSAGE_SELF`` when it runs in this
    process (``LOAD_SELF``; that includes this harness's own small bookkeeping).
    """

    def __init__(self, processes: dict[str, list[int]], load: str, load_name: str) -> None:
        self.trees = {role: [pid for root in roots for pid in process_tree(root)] for role, roots in processes.items()}
        self.load_who = resource.RUSAGE_CHILDREN if load == LOAD_CHILD else resource.RUSAGE_SELF
        self.load_name = load_name
        self.before: dict[str, tuple[float, float]] = {}
        self.after: dict[str, tuple[float, float]] = {}

    def _sample(self) -> dict[str, tuple[float, float]]:
        sample = {role: cpu_ns(pids) for role, pids in self.trees.items()}
        sample[self.load_name] = _rusage_ns(self.load_who)
        return sample

    def __enter__(self) -> CpuMeter:
        self.before = self._sample()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.after = self._sample()

    def per_op(self, ops: float) -> dict[str, Cpu]:
        if ops <= 0:
            return {}
        return {role: Cpu((self.after[role][0] - self.before[role][0]) / 1000 / ops,
                          (self.after[role][1] - self.before[role][1]) / 1000 / ops) for role in self.before}


def median_cpu(runs: list[dict[str, Cpu]]) -> dict[str, Cpu]:
    """Per role, the median over the rounds."""
    roles = list(dict.fromkeys(role for run in runs for role in run))
    medians = {role: Cpu.median([run[role] for run in runs if role in run]) for role in roles}
    return {role: cpu for role, cpu in medians.items() if cpu is not None}


def cpu_line(runs: dict[str, dict[str, Cpu]]) -> str:
    """``direct: backend 9.0 (6), wrk 12.1 (8) | nginx: ...``: every process of every target, per op."""
    return " | ".join(f"{target}: " + ", ".join(f"{role} {cpu}" for role, cpu in cpus.items())
                      for target, cpus in runs.items() if cpus)


# -- nginx --------------------------------------------------------------------------
NGINX_COMMON = """
pid {dir}/{name}.pid;
error_log {dir}/{name}-error.log warn;
{user}
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp-{name}-body;
    proxy_temp_path {dir}/tmp-{name}-proxy;
    fastcgi_temp_path {dir}/tmp-{name}-fcgi;
    uwsgi_temp_path {dir}/tmp-{name}-uwsgi;
    scgi_temp_path {dir}/tmp-{name}-scgi;
    keepalive_requests 10000000;
    {http}
}}
"""


def start_nginx(tmp: Path, name: str, workers: int, http: str) -> subprocess.Popen[bytes]:
    """nginx in the foreground with ``http`` as its http block's body, config, pid and logs in ``tmp``.

    ``keepalive_requests`` is raised for every client connection: nginx 1.22's default (1000) sends
    a GOAWAY or closes after 1000 requests, which a load generator counts as failures.
    """
    if NGINX is None:
        raise RuntimeError(f"nginx is not installed: {NGINX_INSTALL}")
    conf = tmp / f"{name}.conf"
    user = "user root;" if os.geteuid() == 0 else ""
    conf.write_text(f"worker_processes {workers};\ndaemon off;\n"
                    + NGINX_COMMON.format(dir=tmp, name=name, user=user, http=http))
    return subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(conf)], stderr=subprocess.DEVNULL)


def stop_procs(procs: list[subprocess.Popen[bytes]] | list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
