"""Outbound network for a confined sandbox (a local pool's ``network: outbound``): slirp4netns.

A confined sandbox has its own network namespace. With ``network: none`` it holds loopback
only. With ``outbound`` a ``slirp4netns`` process, started by the gateway against the
sandbox's namespace, gives it a ``tap0`` device whose packets it turns into ordinary
sockets on the host (user-mode networking: no bridge, no veth, no NAT rules on the host).

What the sandbox can NOT reach, and why:

* the host's loopback: ``--disable-host-loopback`` (slirp's 10.0.2.2 would otherwise map to
  the host's 127.0.0.1);
* any other address of the host (where the gateway's ports listen when bound to 0.0.0.0):
  a ``prohibit`` route per destination in the host's IPv4 ``local`` routing table inside the
  sandbox's namespace, set before the
  runtime drops its privileges (the sandbox has no capability over its namespace, so it
  cannot remove them); taken when the sandbox starts;
* link-local addresses (169.254.0.0/16: cloud metadata services hand out credentials there);
* IPv6 at all (slirp4netns runs without ``--enable-ipv6``);
* another sandbox: each has its own namespace and its own slirp; nothing is forwarded in.

Everything else routable from the host (its LAN, the cluster network, the internet) is
reachable: that is what outbound means. SECURITY.md says what an operator should add.

How the helper attaches and how long it lives: bubblewrap reports the sandbox's first process
on ``--info-fd`` and holds the sandbox before its command on ``--block-fd``; the gateway starts
slirp4netns against that pid, waits for its ``--ready-fd`` byte, then releases the sandbox,
whose first step configures ``tap0`` and the routes. bubblewrap holds the write end of a pipe
(``--sync-fd``) for as long as the sandbox runs, and slirp4netns exits when it closes
(``--exit-fd``): the helper dies with the sandbox, and with nothing else (it runs in its own
session, so a gateway worker's death does not touch it). pasta (Debian's passt) was tried too:
the packaged 2023 build drops to ``nobody`` before it opens the target namespace, so it cannot
attach to a sandbox started by root.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from gateway.providers._exits import exit_or_kill
from gateway.providers._pipes import read_until

SLIRP = "slirp4netns"
TAP = "tap0"
ADDRESS = "10.0.2.100/24"
GATEWAY = "10.0.2.2"
DNS = "10.0.2.3"  # slirp's resolver: forwards to the host's
#: Never reachable from a sandbox, whatever the host's addresses.
ALWAYS_BLOCKED = ("169.254.0.0/16",)
#: Where bubblewrap finds its ends of the pipes (the gateway dup2s them there).
INFO_FD, BLOCK_FD, SYNC_FD = 4, 5, 6
#: The sandbox's first step: its network, then the rest of its command. Arguments: blocked
#: prefixes, ``--``, the command. Any failure stops the sandbox (a sandbox without its
#: prohibit routes must never run).
NETWORK_UP = (f'ip link set {TAP} up && ip addr add {ADDRESS} dev {TAP} && ip route add default via {GATEWAY} '
              f'dev {TAP} || exit 125; while [ "$1" != -- ]; do ip route add prohibit "$1" || exit 125; shift; '
              'done; shift; exec "$@"')


def check() -> None:
    """Raise ``RuntimeError`` saying what is missing for outbound networking."""
    for tool, package in ((SLIRP, "slirp4netns"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is not installed (Debian: apt-get install {package})")


def blocked_prefixes() -> list[str]:
    """Every IPv4 destination the host delivers to itself (its ``local`` routing table: interface
    addresses, AnyIP ranges, broadcasts) and :data:`ALWAYS_BLOCKED`; loopback aside (the
    sandbox's 127/8 is its own). ``RuntimeError`` when the table cannot be read."""
    try:
        out = subprocess.run(["ip", "-j", "-4", "route", "show", "table", "local"], capture_output=True, text=True,
                             check=True, timeout=10).stdout
        routes = json.loads(out)
        prefixes = {ipaddress.ip_network(r["dst"]) for r in routes if r.get("type") in ("local", "broadcast")}
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"cannot read the host's addresses to keep them from the sandbox: {exc}") from None
    mine = sorted(str(p) for p in prefixes if not p.is_loopback)
    return [*mine, *ALWAYS_BLOCKED]


def sandbox_prefix(blocked: list[str]) -> list[str]:
    """argv to put in front of the sandbox's command (inside bubblewrap, before privileges drop)."""
    return ["/bin/sh", "-c", NETWORK_UP, "sh", *blocked, "--"]


class Attachment:
    """The pipes between the gateway, bubblewrap and slirp4netns for one start of one sandbox."""

    def __init__(self) -> None:
        self._info = os.pipe()
        self._block = os.pipe()
        self._sync = os.pipe()
        self._open = {*self._info, *self._block, *self._sync}

    def file_actions(self) -> list[tuple[int, int, int]]:
        """posix_spawn actions giving bubblewrap its ends at :data:`INFO_FD`, :data:`BLOCK_FD`, :data:`SYNC_FD`."""
        return [(os.POSIX_SPAWN_DUP2, self._info[1], INFO_FD), (os.POSIX_SPAWN_DUP2, self._block[0], BLOCK_FD),
                (os.POSIX_SPAWN_DUP2, self._sync[1], SYNC_FD)]

    def spawned(self) -> None:
        """bubblewrap holds its ends now: close ours, so that its exit is an EOF everywhere."""
        for fd in (self._info[1], self._block[0], self._sync[1]):
            self._close(fd)

    async def connect(self, log_path: Path) -> list[int]:
        """Start slirp4netns on the sandbox's namespace, wait until it is ready, release the
        sandbox; return the helper's identity (:func:`identify`). ``RuntimeError`` when bubblewrap or the helper fail."""
        self._open.discard(self._info[0])  # read_until closes it
        info = await read_until(self._info[0], lambda data: data.rstrip().endswith(b"}"))
        try:
            child = int(json.loads(info)["child-pid"])
        except (ValueError, KeyError, TypeError):
            raise RuntimeError("bubblewrap exited before reporting its sandbox's pid") from None
        ready_r, ready_w = os.pipe()
        argv = [SLIRP, "--disable-host-loopback", "--enable-sandbox", "--enable-seccomp",
                "--exit-fd", "3", "--ready-fd", "4", str(child), TAP]
        try:
            helper = os.posix_spawnp(SLIRP, argv, {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}, setsid=True,
                                     file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                (os.POSIX_SPAWN_DUP2, 1, 2),
                (os.POSIX_SPAWN_DUP2, self._sync[0], 3),
                (os.POSIX_SPAWN_DUP2, ready_w, 4),
            ])
        except OSError as exc:
            os.close(ready_r)
            raise RuntimeError(f"{SLIRP} could not be started: {exc}") from None
        finally:
            os.close(ready_w)
        self._close(self._sync[0])  # the helper's now: it sees EOF when bubblewrap's end closes
        if not await read_until(ready_r, bool):
            if (identity := identify(helper)) is not None:  # our child: a zombie until stop_helper reaps it
                await stop_helper(identity)
            raise RuntimeError(f"{SLIRP} exited before the sandbox's network was ready (see {log_path})")
        identity = identify(helper)
        if identity is None:  # exited already (and so did the sandbox's network)
            raise RuntimeError(f"{SLIRP} exited right after it was ready (see {log_path})")
        os.write(self._block[1], b"1")
        return identity

    def close(self) -> None:
        """Close whatever is still ours (idempotent). A sandbox still blocked reads EOF on its
        block pipe and exits before its command runs."""
        for fd in list(self._open):
            self._close(fd)

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            os.close(fd)


def identify(pid: int) -> list[int] | None:
    """A process's identity that survives PID reuse: ``[pid, start time]`` (what ``state.json`` records)."""
    started = _started(pid)
    return None if started is None else [pid, started]


def helper_alive(helper: Sequence[int]) -> bool:
    """True when the helper ``identify`` named still runs (not a zombie, not a reused PID)."""
    pid, started = helper
    return _started(pid) == started and _state(pid) not in ("Z", "X", None)


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state is [0], starttime [19]
    except (OSError, IndexError):
        return None


def _started(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None


def _state(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[0] if fields is not None else None


def _pidfd_kill(fd: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(fd, signal.SIGKILL)


async def stop_helper(helper: Sequence[int], grace: float = 2.0) -> None:
    """Wait for a helper to exit (it does by itself once its sandbox has: its exit-fd closes),
    SIGKILL it after ``grace``; reap it when it is our child. Never touches a process that
    merely reuses its PID."""
    pid, started = helper
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if _started(pid) != started:  # checked with the pidfd open: it names the process checked
            return
        await exit_or_kill(fd, grace, lambda: _pidfd_kill(fd))
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)  # exactly this process, if it is our child
    finally:
        os.close(fd)
