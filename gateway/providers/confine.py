"""Confinement for local sandboxes: the command line that runs a runtime inside bubblewrap.

A confined sandbox gets its own mount, PID, IPC, UTS and network namespaces (loopback only: it
can reach neither another sandbox's runtime nor the gateway's ports; a pool with
``network: outbound`` adds user-mode networking to the world off the host, see
gateway/providers/outbound.py), a read-only view of
``/usr`` plus the interpreter, the venv and the ``gateway.runtime`` package, a private
``/tmp``, a minimal ``/dev`` and ``/proc``, and one writable directory: its own ``root/``,
mounted at :data:`HOME`. The gateway's data dir, key files, repository and the other
sandboxes are simply not in its view.

Who the sandbox runs as depends on who the gateway is:

* **root**: each sandbox gets its own unprivileged host UID (recorded in its directory, so a
  resumed sandbox finds its files still its own, and claimed in a host-wide registry,
  :data:`UID_REGISTRY`, so two installations on one host, each with its own data dir and the
  same deterministic sandbox IDs, never hand out the same UID). bubblewrap runs privileged to build the
  view and ``setpriv`` drops to that UID with no capabilities in any namespace before the
  runtime starts. No user namespace on purpose: inside one the sandbox would hold every
  capability over its own namespaces, a larger kernel surface than a plain unprivileged
  UID. A per-sandbox UID is also what makes ``RLIMIT_NPROC`` (counted per real UID) a
  per-sandbox bound, and it puts file permissions between sandboxes should a mount leak.
* **not root**: bubblewrap makes a user namespace and the sandbox is UID :data:`INNER_UID`
  inside it; outside it is the gateway's own UID, so ``RLIMIT_NPROC`` is shared with the
  gateway and its other sandboxes (pids cgroups, where writable, still bound each one).

Limits: a ``pids``, a ``memory`` and a ``cpu`` cgroup (v1) per sandbox where the hierarchy is
writable, joined by the launching shell before it execs anything, so no process of the sandbox
starts outside them; ``RLIMIT_NPROC`` and ``RLIMIT_NOFILE`` always; ``RLIMIT_AS`` when there is no
memory cgroup; nice 10.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.providers import disk, outbound, seccomp

#: Where the sandbox's own directory appears inside it (also its HOME and working directory).
HOME = "/home/sandbox"
#: The listening socket the runtime inherits (the gateway binds it; the sandbox never sees its path).
LISTEN_FD = 3
#: The gRPC service's listening socket, likewise (after outbound's INFO_FD, BLOCK_FD and SYNC_FD).
GRPC_FD = 7
#: The seccomp filter bubblewrap loads (seccomp.py: no new user namespaces), opened read-only on this descriptor.
SECCOMP_FD = 8
#: The UID a sandbox has inside its user namespace when the gateway is not root.
INNER_UID = 1000
#: Host UIDs given to sandboxes when the gateway is root: far above any login or subuid range.
UID_BASE = 1_500_000_000
UID_RANGE = 1_000_000
#: Host-wide claims on those UIDs, one file per UID naming the sandbox directory that holds it
#: (every gateway on the host, whatever its data dir, claims here under one lock). Persistent,
#: like the UIDs recorded in sandbox directories and the files they own.
UID_REGISTRY = Path("/var/lib/sandbox-gateway/uids")
CGROUP_V1 = Path("/sys/fs/cgroup")
#: The CPU weight of all local sandboxes together against one of the gateway's threads (1024): see _cgroup_parents.
SANDBOXES_CPU_SHARES = 256
_PASSWD = f"root:x:0:0::/:/bin/sh\nsandbox:x:{{uid}}:{{uid}}::{HOME}:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"
_GROUP = "root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n"
# /etc pieces a shell and Python need; nothing that names the host's users or secrets.
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf", "mime.types",
        "ssl", "ca-certificates")
_JOIN_CGROUPS = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; n=$((n-1)); done; exec "$@"'


@dataclass(frozen=True)
class Limits:
    """Per-sandbox resource limits."""

    memory_bytes: int = 2 * 1024**3
    # RLIMIT_NOFILE is per process: a sandbox may hold processes x open_files descriptors, 131,072 (it was
    # 512 x 4096 = 2 million, two sandboxes' worth of a 24 GiB host's file-max of 2.4 million).
    processes: int = 128
    open_files: int = 1024
    # CPU priority below the gateway's (nice 0): a sandbox's work, or a hundred runtimes starting at once
    # in a wake storm, never starves the loop that serves every tenant and renews the wakes' leases.
    # A sandbox cannot raise it back (no CAP_SYS_NICE, RLIMIT_NICE 0).
    nice: int = 10


#: What a running local sandbox is reckoned to take of the host's memory for the default cap: an idle runtime
#: takes about 25 MiB (60 took 1.5 GB), a working one more; each may use up to its memory limit.
SANDBOX_FOOTPRINT = 256 * 1024**2


def host_sandbox_cap() -> int:
    """How many local sandboxes may run at once by default: the host's memory at SANDBOX_FOOTPRINT each
    (96 on a 24 GiB host)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, memory // SANDBOX_FOOTPRINT)


@dataclass(frozen=True)
class Launch:
    """How to start one sandbox: the argv to spawn, the cgroups it will join (to clean up), and
    whether it waits for its outbound network (``outbound.Attachment``) before its command runs."""

    argv: list[str]
    cgroups: list[str]
    outbound: bool = False
    files: tuple[tuple[int, str], ...] = ()  # (descriptor, path): opened read-only for the launch (the filter)


class Unconfined:
    """Runs the runtime as the gateway's own user with the host's view: only when explicitly accepted."""

    confined = False

    def __init__(self, python: str, limits: Limits = Limits()) -> None:
        self._python = python
        self._limits = limits

    def check(self) -> None:
        return None

    def check_outbound(self) -> None:
        return None  # it shares the host's network already

    def prepare(self, box: Path, sandbox_id: str, network: str = "none") -> Launch:
        root = box / "root"
        root.mkdir(parents=True, exist_ok=True)
        # No RLIMIT_NPROC here: it would count every process of the gateway's user.
        return Launch(["nice", "-n", str(self._limits.nice), "prlimit", f"--nofile={self._limits.open_files}", "--",
            self._python, "-m", "gateway.runtime", "--listen-fd", str(LISTEN_FD), "--grpc-fd", str(GRPC_FD),
            "--root", str(root),
            "--sandbox-id", sandbox_id], [])

    def release(self, launch_cgroups: list[str]) -> None:
        return None

    def describe(self) -> str:
        return "UNCONFINED (each sandbox runs as the gateway's user and sees the host)"


class Bubblewrap:
    """Runs each runtime in bubblewrap; see the module docstring for what that gives."""

    confined = True

    def __init__(self, data_dir: Path, python: str = sys.executable, limits: Limits = Limits(), *,
                 bwrap: str | None = None, disk_quota: int = 0, uid_registry: Path = UID_REGISTRY) -> None:
        """``disk_quota``: bytes of each sandbox's own filesystem (disk.py; 0: none, the data dir's is shared;
        ``serve`` gives ``local_disk_quota_bytes``, 10 GiB by default). ``uid_registry``: where host UIDs are
        claimed, shared by every installation on the host."""
        self._data_dir = data_dir
        self._uid_registry = uid_registry
        self._python = python
        self._limits = limits
        self._bwrap = bwrap or shutil.which("bwrap") or "bwrap"
        self._root = os.geteuid() == 0
        self._no_quota = "local_disk_quota_bytes is 0" if not disk_quota else disk.unavailable()
        self._quota = disk_quota if self._no_quota is None else 0
        try:
            self._filter: bytes | None = seccomp.no_new_userns()
        except seccomp.Unsupported:
            self._filter = None  # described at startup: sandboxes may then create user namespaces

    @functools.cached_property
    def _cgroup_parents(self) -> dict[str, Path]:
        # Named after the data dir: two gateways on one host (tests, replicas with their own
        # dirs) may run sandboxes of the same ID, and must not clean up each other's.
        tag = "sgw-" + hashlib.sha256(str(self._data_dir).encode()).hexdigest()[:12]
        return _cgroup_parents(tag) if self._root else {}

    # -- startup -------------------------------------------------------------
    def check(self) -> None:
        """Raise ``RuntimeError`` saying why when bubblewrap cannot run here."""
        if shutil.which(self._bwrap) is None:
            raise RuntimeError(f"bubblewrap ({self._bwrap}) is not installed (Debian: apt-get install bubblewrap)")
        userns = [] if self._root else ["--unshare-user"]
        try:
            probe = subprocess.run([self._bwrap, *userns, "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/",
                                    "--proc", "/proc", "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"bubblewrap does not run here: {exc}") from None
        if probe.returncode != 0:
            raise RuntimeError(f"bubblewrap does not run here: {probe.stderr.decode(errors='replace').strip()}")

    def check_outbound(self) -> None:
        """Raise ``RuntimeError`` saying why sandboxes cannot have outbound network here."""
        if not self._root:
            raise RuntimeError("outbound network for local sandboxes needs the gateway to run as root (without it "
                               "sandboxes run in a user namespace, which this gateway does not network yet)")
        outbound.check()

    def describe(self) -> str:
        who = "one unprivileged UID per sandbox" if self._root else f"UID {INNER_UID} in a user namespace"
        cgroups = "+".join(sorted(self._cgroup_parents)) or "none writable"
        userns = "new user namespaces denied (seccomp)" if self._filter is not None else \
            "new user namespaces NOT denied (no seccomp filter for this architecture)"
        userns += (f"; disk {self._quota // 1024**2} MiB each" if self._quota else
                   f"; no disk quota ({self._no_quota}): sandboxes share the data dir's filesystem")
        return (f"confined by bubblewrap ({who}; {userns}; network per pool: none or outbound; cgroups: {cgroups}; "
                f"processes {self._limits.processes}, open files {self._limits.open_files}, "
                f"memory {self._limits.memory_bytes // 1024**2} MiB)")

    # -- per sandbox ---------------------------------------------------------
    def prepare(self, box: Path, sandbox_id: str, network: str = "none") -> Launch:
        """Set up ``box`` (its UID, its ``root/``, its passwd, its cgroups) and return how to launch it.

        ``network`` is the pool's: ``none`` or ``outbound`` (blocked: the host's addresses as they are now).
        """
        root = box / "root"
        root.mkdir(parents=True, exist_ok=True)
        image = disk.image(box, self._quota) if self._quota else None
        uid = self._uid(box) if self._root else INNER_UID
        if self._root:
            os.chown(root, uid, uid)
        root.chmod(0o700)
        etc = box / "etc"
        etc.mkdir(exist_ok=True)
        (etc / "passwd").write_text(_PASSWD.format(uid=uid))
        (etc / "group").write_text(_GROUP.format(uid=uid))
        (etc / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")
        online = network == "outbound"
        if online:
            (etc / "resolv.conf").write_text(f"nameserver {outbound.DNS}\n")
        cgroups = self._make_cgroups(sandbox_id)
        blocked = outbound.blocked_prefixes() if online else None
        files: tuple[tuple[int, str], ...] = ()
        if self._filter is not None:
            bpf = box / "seccomp.bpf"
            bpf.write_bytes(self._filter)
            files = ((SECCOMP_FD, str(bpf)),)
        argv = [*_prlimit(self._limits, address_space="memory" not in self._cgroup_parents),
                *(disk.launch_prefix(image, root, uid) if image is not None else ()),
                *self._bwrap_argv(box, uid, sandbox_id, blocked, filtered=bool(files))]
        if cgroups:
            procs = [str(Path(c) / "cgroup.procs") for c in cgroups]
            argv = ["/bin/sh", "-c", _JOIN_CGROUPS, "sh", str(len(procs)), *procs, *argv]
        return Launch(argv, cgroups, outbound=online, files=files)

    def release(self, cgroups: list[str]) -> None:
        """Kill whatever is left in the sandbox's cgroups (a fork bomb's stragglers) and remove them."""
        for path in cgroups:
            cgroup = Path(path)
            # cgroup v1 has no event for "empty": a killed process leaves cgroup.procs once it has
            # exited, a few ms later; bounded at 2 s (runs in a worker thread, never on the loop).
            for _ in range(200):
                try:
                    pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.01)
            with contextlib.suppress(OSError):
                cgroup.rmdir()

    def _bwrap_argv(self, box: Path, uid: int, sandbox_id: str, blocked: list[str] | None, *,
                    filtered: bool = False) -> list[str]:
        view = _View()
        # The private /tmp first: a later one would hide whatever is bound below it (a checkout and
        # its venv under /tmp, as CI's may be).
        view.tmpfs("/tmp", perms="1777")
        view.ro("/usr")
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / name
            if host.is_symlink():
                view.args += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                view.ro(str(host))
        # The interpreter's installation and its venv (site-packages: aiohttp), read-only, at their own paths.
        prefixes = {sys.base_prefix, sys.prefix, str(Path(self._python).resolve().parent.parent)}
        venv = Path(self._python).parent.parent
        if (venv / "pyvenv.cfg").exists():
            prefixes.add(str(venv))
        for prefix in sorted(prefixes):
            if prefix != "/usr" and not prefix.startswith("/usr/"):
                view.ro(prefix)
        package = Path(__file__).resolve().parent.parent  # .../gateway
        view.ro(str(package / "__init__.py"), "/opt/sandbox-runtime/gateway/__init__.py")
        view.ro(str(package / "_compiled.py"), "/opt/sandbox-runtime/gateway/_compiled.py")  # __init__ imports it
        view.ro(str(package / "runtime"), "/opt/sandbox-runtime/gateway/runtime")
        view.dir("/etc")
        for name in _ETC:
            if (Path("/etc") / name).exists():
                view.ro(f"/etc/{name}")
        for name in ("passwd", "group", "hosts", *(("resolv.conf",) if blocked is not None else ())):
            view.ro(str(box / "etc" / name), f"/etc/{name}")
        view.dir("/home")
        view.args += ["--bind", str(box / "root"), HOME, "--proc", "/proc", "--dev", "/dev",
                      "--chdir", HOME, "--hostname", "sandbox",
                      "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                      "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", HOME,
                      "--setenv", "USER", "sandbox", "--setenv", "LANG", "C.UTF-8",
                      "--setenv", "PYTHONPATH", "/opt/sandbox-runtime", "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
        if self._root:
            drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                    "--bounding-set=-all", "--no-new-privs", "--"]
        else:
            view.args += ["--unshare-user", "--uid", str(INNER_UID), "--gid", str(INNER_UID), "--cap-drop", "ALL"]
            drop = []
        runtime = [self._python, "-m", "gateway.runtime", "--listen-fd", str(LISTEN_FD), "--grpc-fd", str(GRPC_FD),
                   "--root", HOME,
                   "--sandbox-id", sandbox_id]
        if filtered:  # loaded last, just before the command: bubblewrap's own setup is not filtered
            view.args += ["--seccomp", str(SECCOMP_FD)]
        network: list[str] = []
        if blocked is not None:  # root only (check_outbound): the network is set up before privileges drop
            view.args += ["--info-fd", str(outbound.INFO_FD), "--block-fd", str(outbound.BLOCK_FD),
                          "--sync-fd", str(outbound.SYNC_FD)]
            network = outbound.sandbox_prefix(blocked)
        return [self._bwrap, *view.args, "--", *network, *drop, *runtime]

    def _uid(self, box: Path) -> int:
        """This sandbox's host UID: the one recorded in its directory, else a free one.

        Free means unclaimed in the host-wide registry, or claimed by a sandbox directory that no
        longer records it (destroyed: its claim is stale). Claims are made under the registry's
        lock, so two gateways (any data dirs) never take one UID. A recorded UID that another live
        sandbox directory claims (two installations from before the registry) is refused."""
        box = box.absolute()
        recorded = box / "uid"
        registry = self._uid_registry
        registry.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(registry / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(OSError, ValueError):
                uid = int(recorded.read_text())
                owner = _claimant(registry, uid)
                if owner is not None and owner != box:
                    raise RuntimeError(f"host UID {uid} recorded in {recorded} is also held by {owner} (another "
                                       "installation on this host): destroy one of the two sandboxes")
                (registry / str(uid)).write_text(str(box))
                return uid
            # Start from the sandbox's place on this host (its directory), then take the first free one.
            start = int.from_bytes(hashlib.sha256(str(box).encode()).digest()[:4], "big") % UID_RANGE
            for i in range(UID_RANGE):
                uid = UID_BASE + (start + i) % UID_RANGE
                if _claimant(registry, uid) is None:
                    (registry / str(uid)).write_text(str(box))
                    recorded.write_text(str(uid))
                    return uid
            raise RuntimeError(f"no free host UID left in {UID_BASE}-{UID_BASE + UID_RANGE - 1}")
        finally:
            os.close(fd)

    def _make_cgroups(self, sandbox_id: str) -> list[str]:
        made = []
        for controller, parent in sorted(self._cgroup_parents.items()):
            cgroup = parent / sandbox_id
            try:
                cgroup.mkdir(parents=True, exist_ok=True)
                if controller == "pids":
                    (cgroup / "pids.max").write_text(str(self._limits.processes))
                elif controller == "memory":
                    (cgroup / "memory.limit_in_bytes").write_text(str(self._limits.memory_bytes))
                # cpu: equal shares among the sandboxes, inside their parent's (SANDBOXES_CPU_SHARES)
            except OSError:
                continue
            made.append(str(cgroup))
        return made


def _claimant(registry: Path, uid: int) -> Path | None:
    """The sandbox directory that holds ``uid``: named by its claim and still recording it; else None."""
    try:
        owner = Path((registry / str(uid)).read_text())
        if int((owner / "uid").read_text()) == uid:
            return owner
    except (OSError, ValueError):
        pass
    return None


class _View:
    """bwrap arguments for a read-only view, creating each parent directory world-readable
    (bubblewrap's own are 0700, which an unprivileged UID could not traverse)."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self._dirs: set[str] = {"/"}

    def dir(self, path: str) -> None:
        parent = str(Path(path).parent)
        if parent not in self._dirs:
            self.dir(parent)
        if path not in self._dirs:
            self._dirs.add(path)
            self.args += ["--perms", "0755", "--dir", path]

    def tmpfs(self, path: str, perms: str) -> None:
        self.dir(str(Path(path).parent))
        self._dirs.add(path)
        self.args += ["--perms", perms, "--tmpfs", path]

    def ro(self, source: str, dest: str | None = None) -> None:
        dest = dest or source
        self.dir(str(Path(dest).parent))
        self._dirs.add(dest)
        self.args += ["--ro-bind", source, dest]


def _prlimit(limits: Limits, *, address_space: bool) -> list[str]:
    argv = ["nice", "-n", str(limits.nice), "prlimit", f"--nproc={limits.processes}", f"--nofile={limits.open_files}"]
    if address_space:
        argv.append(f"--as={limits.memory_bytes}")
    return [*argv, "--"]


def _cgroup_parents(tag: str) -> dict[str, Path]:
    """Per controller (pids, memory, cpu; cgroup v1), the directory under our own cgroup where
    sandboxes' cgroups go, when we may create it. Nested under ours: a sandbox never escapes
    a limit the gateway itself runs under. The cpu parent weighs SANDBOXES_CPU_SHARES against each of
    the gateway's own threads (1024): a nice value is per process, and a hundred sandboxes at nice 10
    still outweighed the gateway's loop ten to one (a wake storm: the loop ran at 3-8% of a core for
    seconds, its lease renewals late); as one group, all the sandboxes together get a fifth of what the
    loop gets when both want the CPU, and each sandbox an equal part of that (one busy sandbox does not
    take another's). Unused, it is theirs: shares only weigh contention."""
    parents: dict[str, Path] = {}
    for controller, own in own_cgroups().items():
        parent = own / tag
        try:
            parent.mkdir(exist_ok=True)
            if controller == "cpu":
                (parent / "cpu.shares").write_text(str(SANDBOXES_CPU_SHARES))
        except OSError:
            continue
        if os.access(parent, os.W_OK):
            parents[controller] = parent
    return parents


def own_cgroups() -> dict[str, Path]:
    """Per controller a sandbox is limited by (pids, memory, cpu; cgroup v1), this process's own cgroup."""
    own: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in ("pids", "memory", "cpu"):
            if controller in controllers.split(","):
                own[controller] = CGROUP_V1 / controller / path.lstrip("/")
    return own
