"""Where a benchmark's processes run: which cores (``cores``, ``pinned``), and a CPU cap for a group of them
(``CpuCap``: a cgroup v1 ``cpu`` group with a CFS quota).

benchmarks/neighbours.py runs its attackers under a cap, as if they ran on a machine of their own with a
bounded share of it: on a 2-core box the attack's client processes share a core with the victim's client, and
what they take there is the attacker's cost, not the gateway's. A quota (not a weight, not SCHED_IDLE) bounds
them whatever else runs and still gives them that share when the victim's client is busy: SCHED_IDLE starved
the attack itself (session 17).

The group is made under this process's own cpu cgroup (``bench-attackers-PID-N``) and removed when the ``with`` ends,
failed or not; one left behind by a killed run (its PID gone) is removed by the next ``CpuCap``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

PERIOD_US = 100_000
PREFIX = "bench-attackers-"  # not sgw-*: tests/conftest.py removes the empty sgw-* groups a test run made
_made = itertools.count()


def cores() -> tuple[set[int], set[int]] | None:
    """The gateway's core and the others' (victim, attackers), or None with fewer than two usable cores."""
    usable = sorted(os.sched_getaffinity(0))
    return ({usable[0]}, set(usable[1:])) if len(usable) >= 2 else None


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """This process (and what it starts meanwhile, which inherits it) on ``cpus``; None: unchanged."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def own_cpu_cgroup() -> Path | None:
    """This process's cgroup in the v1 ``cpu`` hierarchy, when it is mounted and we may make groups in it."""
    from gateway.providers.confine import own_cgroups

    parent = own_cgroups().get("cpu")
    if parent is not None and (parent / "cpu.cfs_quota_us").exists() and os.access(parent, os.W_OK):
        return parent
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(group: Path) -> None:
    """Move whatever is still in ``group`` to its parent, then remove it (v1 refuses to remove a group with tasks)."""
    for _ in range(100):
        with contextlib.suppress(OSError):
            pids = (group / "cgroup.procs").read_text().split()
            for pid in pids:
                with contextlib.suppress(OSError):
                    (group.parent / "cgroup.procs").write_text(pid)
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # a task leaving; v1 has no event for "empty"
    group.rmdir()


def sweep(parent: Path) -> list[Path]:
    """Remove groups left by runs whose process is gone (killed before their ``with`` ended)."""
    removed = []
    for group in parent.glob(PREFIX + "*"):
        pid = group.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                _remove(group)
                removed.append(group)
    return removed


class CpuCap:
    """A cpu cgroup whose processes together get at most ``cpus`` of a core (a CFS quota per 100 ms period) while
    :meth:`hold` is on (from the start, unless ``held=False``: an attack's first wave and its end are not what is
    measured, and capped they took minutes).

    ``with CpuCap(0.3) as cap``: processes started with ``preexec_fn=cap.join`` run in it. ``cpus`` None or 0,
    or no writable cgroup v1 ``cpu`` hierarchy: no group, ``join`` does nothing, ``describe`` says why. The
    group keeps the default weight (cpu.shares 1024, one ordinary process's): inside its cap it gets its share
    however loaded the machine is, where a low weight (nice 19, SCHED_IDLE) left the attack to whatever the
    machine's other work left over."""

    def __init__(self, cpus: float | None, held: bool = True) -> None:
        self.held = held
        self.cpus = cpus or None
        self.quota_us = max(1000, round(cpus * PERIOD_US)) if cpus else 0
        self.parent = own_cpu_cgroup() if self.cpus else None
        self.group: Path | None = None

    def __enter__(self) -> CpuCap:
        if self.parent is None:
            return self
        sweep(self.parent)
        group = self.parent / f"{PREFIX}{os.getpid()}-{next(_made)}"
        group.mkdir()
        self.group = group
        try:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            self.hold(self.held)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        group, self.group = self.group, None
        if group is not None:
            _remove(group)

    def hold(self, on: bool = True) -> None:
        """The quota on (or off: -1, uncapped)."""
        self.held = on
        if self.group is not None:
            (self.group / "cpu.cfs_quota_us").write_text(str(self.quota_us if on else -1))

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """The quota on for the ``with``, off after it, failed or not."""
        self.hold()
        try:
            yield
        finally:
            self.hold(False)

    def join(self) -> None:
        """In a child before it runs (``preexec_fn``): into the group."""
        if self.group is not None:
            (self.group / "cgroup.procs").write_text(str(os.getpid()))

    def stat(self) -> dict[str, int]:
        """The kernel's count of periods, periods in which the group was throttled, and ns it was throttled."""
        if self.group is None:
            return {}
        fields = dict(line.split() for line in (self.group / "cpu.stat").read_text().splitlines())
        return {key: int(fields.get(key, 0)) for key in ("nr_periods", "nr_throttled", "throttled_time")}

    def describe(self) -> str:
        if not self.cpus:
            return "attackers uncapped"
        if self.parent is None:
            return f"attackers NOT capped (asked {self.cpus:g} CPU: no writable cgroup v1 cpu hierarchy)"
        return f"attackers capped at {self.cpus:g} CPU (cgroup cpu.cfs_quota_us {self.quota_us} per {PERIOD_US} us)"
