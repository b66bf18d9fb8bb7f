"""A local pool's ``network: outbound``: real bubblewrap, real slirp4netns, the real gateway in-process.

The allowed destination is a TCP server on the far side of a veth pair in a network namespace
the test creates (an address routable from the host but not the host's own, as a LAN or cluster
peer is). The gateway listens on 0.0.0.0, so its ports are on every host address the sandbox
might try. Needs root (bubblewrap's privileged mode, ``ip netns``) and slirp4netns.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from gateway.app import Gateway, load_policy
from gateway.metrics import Metrics
from gateway.providers import outbound
from gateway.providers.base import PoolProviders
from gateway.providers.confine import Bubblewrap, Limits
from gateway.providers.local import LocalProvider
from gateway.settings import Settings
from gateway.store.instrumented import InstrumentedStore
from gateway.store.memory import MemoryStore
from routing.policy import PolicyError, parse_policy
from tests.gateway_process import GatewayProcess

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or shutil.which("slirp4netns") is None,
    reason="outbound sandboxes need root, bubblewrap and slirp4netns (scripts/test installs them)")

POLICY = """
pools:
  online: {local: {network: outbound}}
  offline: {local: {network: none}}
routing:
  per_session_orgs: ["*"]
  prefix_pools: {ses: online, default: online}
orgs:
  dark-org: {pool: offline}
"""
PROBE = (
    "import json, socket, sys\n"
    "out = {}\n"
    "for name, (host, port) in json.loads(sys.argv[1]).items():\n"
    "    try:\n"
    "        with socket.create_connection((host, port), timeout=3) as s:\n"
    "            s.settimeout(3); out[name] = s.recv(64).decode() or 'connected'\n"
    "    except OSError as exc:\n"
    "        out[name] = type(exc).__name__\n"
    "print(json.dumps(out))\n"
)
# Answers every connection with one line, so that "reached" is unmistakable.
SERVER = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], 0)); s.listen(16)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(sys.argv[2].encode()); c.close()\n"
)


@dataclass
class Peer:
    address: str
    port: int


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _serve(argv_prefix: list[str], host: str, answer: str) -> tuple[subprocess.Popen[str], int]:
    server = subprocess.Popen([*argv_prefix, sys.executable, "-c", SERVER, host, answer], stdout=subprocess.PIPE,
                              text=True)
    assert server.stdout is not None
    return server, int(server.stdout.readline())


def _stop(server: subprocess.Popen[str]) -> None:
    server.kill()
    server.wait()
    assert server.stdout is not None
    server.stdout.close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    """A server on 10.213.N.2, the far end of a veth pair in its own network namespace."""
    tag = secrets.token_hex(3)
    netns, host_if, peer_if = f"sgw-{tag}", f"sgwh{tag}", f"sgwp{tag}"
    subnet = f"10.213.{int(tag, 16) % 250}"
    _ip("netns", "add", netns)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        _ip("link", "set", peer_if, "netns", netns)
        _ip("addr", "add", f"{subnet}.1/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", netns, "addr", "add", f"{subnet}.2/30", "dev", peer_if)
        _ip("-n", netns, "link", "set", peer_if, "up")
        server, port = _serve(["ip", "netns", "exec", netns], f"{subnet}.2", "peer-ok")
        try:
            yield Peer(f"{subnet}.2", port)
        finally:
            _stop(server)
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        _ip("netns", "del", netns)


@dataclass
class Stack:
    gateway: Gateway
    data_dir: Path
    http: aiohttp.ClientSession

    @property
    def ports(self) -> tuple[int, int]:
        assert self.gateway.data_address is not None and self.gateway.control_address is not None
        return self.gateway.data_address[1], self.gateway.control_address[1]

    async def run(self, org: str, session: str, command: str) -> dict:
        headers = {"X-Org-Id": org, "X-User-Id": "u", "X-Session-Id": session}
        async with self.http.post(f"http://127.0.0.1:{self.ports[0]}/execute", headers=headers,
                                  json={"command": command, "timeout_seconds": 30}) as response:
            assert response.status == 200, await response.text()
            return await response.json()

    async def box(self, session: str) -> Path:
        async with self.http.get(f"http://127.0.0.1:{self.ports[1]}/v1/sessions/{session}") as response:
            return self.data_dir / "sandboxes" / (await response.json())["sandbox_id"]

    async def probe(self, org: str, session: str, targets: dict[str, tuple[str, int]]) -> dict[str, str]:
        await self.run(org, session, "true")  # bound, so that its directory is known
        (await self.box(session)).joinpath("root", "probe.py").write_text(PROBE)
        seen = await self.run(org, session, f"{sys.executable} probe.py {shlex.quote(json.dumps(targets))}")
        assert seen["exit_code"] == 0, seen
        return json.loads(seen["stdout"])


def _any_address_socket() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    data_dir = (tmp_path / "data").absolute()
    (tmp_path / "policy.yaml").write_text(POLICY)
    settings = Settings(data_dir=data_dir, policy_file=tmp_path / "policy.yaml", access_log=False)
    policy = load_policy(settings)
    metrics = Metrics()
    local = LocalProvider(data_dir, stop_on_close=True, confinement=Bubblewrap(data_dir, limits=Limits(processes=64)),
                          networks={"online": "outbound", "offline": "none"}, policy_source=policy.source)
    gateway = Gateway(settings, policy, InstrumentedStore(MemoryStore(), metrics),
                      PoolProviders({name: local for name in policy.pools}), metrics)
    await gateway.start(_any_address_socket(), _any_address_socket())
    try:
        async with aiohttp.ClientSession() as http:
            yield Stack(gateway, data_dir, http)
    finally:
        await gateway.stop()


def _host_addresses() -> list[str]:
    """The host's own (non-loopback) IPv4 addresses, as the kernel lists them."""
    out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return sorted(info["local"] for link in json.loads(out) for info in link.get("addr_info", [])
                  if not info["local"].startswith("127."))


async def test_outbound_reaches_the_network_but_not_the_host_nor_another_sandbox(stack, peer):
    other = await stack.run("org-b", "other", "setsid python3 -c " + shlex.quote(SERVER) + " 0.0.0.0 other-sandbox "
                            "> port.txt 2>/dev/null < /dev/null & while [ ! -s port.txt ]; do sleep 0.01; done; cat port.txt")
    other_port = int(other["stdout"])
    data_port, control_port = stack.ports
    loopback_server, loopback_port = _serve([], "127.0.0.1", "host-loopback")
    try:
        targets = {"peer": (peer.address, peer.port),
                   "host loopback server": ("127.0.0.1", loopback_port),
                   "host loopback via slirp's gateway": (outbound.GATEWAY, loopback_port),
                   "control API via slirp's gateway": (outbound.GATEWAY, control_port),
                   "metadata service": ("169.254.169.254", 80),
                   "the other sandbox's server": ("10.0.2.100", other_port)}
        for address in _host_addresses():
            targets[f"data plane on {address}"] = (address, data_port)
            targets[f"control API on {address}"] = (address, control_port)
        seen = await stack.probe("org-a", "mine", targets)
    finally:
        _stop(loopback_server)
    assert seen.pop("peer") == "peer-ok"
    assert _host_addresses(), "the host has a non-loopback address to try"
    reached = {name: outcome for name, outcome in seen.items() if not outcome.endswith("Error")}
    assert reached == {}, seen
    # What the sandbox sees: its tap, the default route via slirp, a prohibit route per host address.
    routes = (await stack.run("org-a", "mine", "ip route"))["stdout"]
    assert f"default via {outbound.GATEWAY} dev {outbound.TAP}" in routes
    prohibited = {line.split()[1] for line in routes.splitlines() if line.startswith("prohibit ")}
    assert set(_host_addresses()) <= prohibited, routes


async def test_the_sandbox_cannot_lift_its_own_blocks(stack):
    seen = await stack.run("org-a", "mine", "ip route del prohibit 169.254.0.0/16; ip link set tap0 down; ip route")
    assert "Operation not permitted" in seen["stderr"]
    assert "prohibit 169.254.0.0/16" in seen["stdout"] and "default via" in seen["stdout"]


async def test_a_none_pool_has_no_route_at_all(stack, peer):
    assert (await stack.run("dark-org", "dark", "ip route"))["stdout"].strip() == ""
    assert await stack.probe("dark-org", "dark", {"peer": (peer.address, peer.port)}) == {"peer": "OSError"}
    box = await stack.box("dark")
    assert json.loads((box / "state.json").read_text())["helper"] is None


async def test_dns_resolves_through_the_hosts_resolver(stack):
    name = "deb.debian.org"
    try:
        await asyncio.get_running_loop().getaddrinfo(name, 80)
    except OSError:
        pytest.skip(f"this host cannot resolve {name}")
    seen = await stack.run("org-a", "mine", f"getent hosts {name}")
    assert seen["exit_code"] == 0 and name in seen["stdout"], seen


async def test_the_helper_dies_with_its_sandbox_and_leaves_nothing_after_delete(stack):
    await stack.run("org-a", "mine", "true")
    box = await stack.box("mine")
    state = json.loads((box / "state.json").read_text())
    helper = state["helper"]
    assert outbound.helper_alive(helper)
    assert os.getsid(helper[0]) == helper[0] != os.getsid(0)  # its own session: a gateway's death does not reach it
    async with stack.http.delete(f"http://127.0.0.1:{stack.ports[1]}/v1/sessions/mine") as response:
        assert response.status in (200, 204), await response.text()
    assert not outbound.helper_alive(helper)
    assert outbound.identify(helper[0]) != helper  # reaped too: not even a zombie
    assert not box.exists()


async def test_a_sandbox_that_dies_takes_its_helper_with_it(stack):
    await stack.run("org-a", "mine", "true")
    state = json.loads((await stack.box("mine")).joinpath("state.json").read_text())
    assert outbound.helper_alive(state["helper"])
    fd = os.pidfd_open(state["helper"][0])
    try:
        os.killpg(state["pid"], 9)
        loop = asyncio.get_running_loop()
        gone = loop.create_future()
        loop.add_reader(fd, lambda: gone.done() or gone.set_result(None))
        try:
            await asyncio.wait_for(gone, 10)  # its exit-fd closed with bubblewrap
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


def test_outbound_is_a_local_pool_setting_checked_by_name(tmp_path):
    with pytest.raises(PolicyError) as bad:
        parse_policy("pools:\n  p: {local: {network: everywhere}}\n", "policy.yaml")
    assert "policy.yaml: pools.p.local.network" in str(bad.value)
    with pytest.raises(PolicyError) as wrong_provider:
        parse_policy("pools:\n  p: {provider: static, upstreams: ['http://a'], local: {network: outbound}}\n",
                     "policy.yaml")
    assert "local only applies to provider 'local'" in str(wrong_provider.value)
    policy = parse_policy("pools:\n  small: {}\n  shared: {local: {network: outbound}}\n")
    assert policy.pools["small"].network == "none"  # the default
    assert "pool shared: provider=local" in policy.summary() and "network=outbound" in policy.summary()


def test_serve_refuses_an_outbound_pool_on_a_host_without_slirp4netns(tmp_path):
    (tmp_path / "policy.yaml").write_text(POLICY)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bwrap", "ip", "true", "prlimit", "setpriv"):  # everything but slirp4netns
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    # subprocess.run, not GatewayProcess: asyncio's child watcher sometimes reports 255 for a
    # child that exits this fast (seen on main's test_confinement serve test too).
    refused = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--data-port", "0", "--control-port", "0",
                              "--grpc-port", "0", "--policy", str(tmp_path / "policy.yaml"),
                              "--data-dir", str(tmp_path / "data")],
                             env={**os.environ, "PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60,
                             check=False)
    assert refused.returncode == 2, refused.stderr
    assert f"{tmp_path / 'policy.yaml'}: pools.online.local.network" in refused.stderr
    assert "slirp4netns is not installed" in refused.stderr


async def test_a_sandbox_and_its_network_outlive_the_gateway_process(tmp_path, peer):
    """SIGKILL the gateway (no shutdown at all): the sandbox and its helper stay, and the next
    gateway on the same data dir hands the owner the same sandbox, still online."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    args = ("--policy", str(tmp_path / "policy.yaml"), "--data-dir", str(tmp_path / "data"))
    headers = {"X-Org-Id": "org-a", "X-User-Id": "u", "X-Session-Id": "long"}
    probe = {"command": f"{sys.executable} -c {shlex.quote(PROBE)} "
                        + shlex.quote(json.dumps({"peer": [peer.address, peer.port]})), "timeout_seconds": 30}
    first = await GatewayProcess(tmp_path / "gw1", *args).start()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{first.data_url}/execute", headers=headers, json=probe) as response:
            assert json.loads((await response.json())["stdout"]) == {"peer": "peer-ok"}
        [state_file] = (tmp_path / "data" / "sandboxes").glob("*/state.json")
        state = json.loads(state_file.read_text())
        await first.stop(signal.SIGKILL)
        assert outbound.helper_alive(state["helper"])
        second = await GatewayProcess(tmp_path / "gw2", *args).start()
        try:
            async with http.post(f"{second.data_url}/execute", headers=headers, json=probe) as response:
                assert json.loads((await response.json())["stdout"]) == {"peer": "peer-ok"}
            assert json.loads(state_file.read_text())["helper"] == state["helper"]  # the same one, not a new one
        finally:
            assert await second.stop() == 0  # the memory store's gateway stops its sandboxes on exit
    assert not outbound.helper_alive(state["helper"])
