"""What an idle connection costs the gateway: its CPU per connection accepted and then closed at its deadline, on
the gRPC front and on the data plane (issue 28).

    .venv/bin/python benchmarks/idle_churn.py [--connections 2000] [--sources 4] [--deadline 1] [--seconds 15]

A ``serve`` with its defaults but both deadlines at ``--deadline`` (``grpc_handshake_timeout``,
``header_read_timeout``), and benchmarks/attackers.py holding ``--connections`` idle connections from
``--sources`` addresses against one port, each opened again at once when the gateway closes it: about 1,500
closes a second at the defaults. Over ``--seconds``, once the first deadlines have passed, the gateway's CPU
(every thread) is divided by the connections it closed at their deadline in that time
(``sgw_grpc_connections_closed_total{reason="handshake_timeout"}``, ``sgw_head_timeouts_total``).

Session 13 found the gRPC front at 3.6 times the data plane's cost this way (409 against 99-115 us): a timer
that fired every loop turn until uvloop's millisecond clock caught up with its deadline, and writes to peers
that never read them. CPU per connection does not grow with load as a rate does; say the load anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.attackers import Attack  # noqa: E402
from benchmarks.harness import cpu_ns, footer, header  # noqa: E402

CLOSED_AT_DEADLINE = ('sgw_grpc_connections_closed_total{reason="handshake_timeout"}', "sgw_head_timeouts_total")


async def closed_at_deadline(control_url: str) -> float:
    """Connections the gateway closed at their deadline so far, both ports."""
    async with aiohttp.ClientSession() as http, http.get(f"{control_url}/metrics") as response:
        text = await response.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(CLOSED_AT_DEADLINE))


async def churn(port: str, args: argparse.Namespace) -> tuple[float, float]:
    """(CPU seconds, connections closed at their deadline) of one gateway over the measured window."""
    from tests.gateway_process import GatewayProcess

    deadline = str(args.deadline)
    with tempfile.TemporaryDirectory() as tmp:
        gateway = await GatewayProcess(Path(tmp) / "gw", env={
            "SANDBOX_GATEWAY_GRPC_HANDSHAKE_TIMEOUT": deadline, "SANDBOX_GATEWAY_HEADER_READ_TIMEOUT": deadline,
            "SANDBOX_GATEWAY_ACCESS_LOG": "false"}).start()
        try:
            target = gateway.grpc_address if port == "grpc" else gateway.data_url.split("://", 1)[1]
            sources = [f"127.0.0.{2 + i}" for i in range(args.sources)]
            async with Attack(target, "idle", args.connections, sources, args.connections, reopen=30.0):
                await asyncio.sleep(2 * args.deadline)  # past the first wave of deadlines: a steady churn
                closed, cpu = await closed_at_deadline(gateway.control_url), cpu_ns([gateway.proc.pid])[0]
                await asyncio.sleep(args.seconds)  # the measured window
                closed = await closed_at_deadline(gateway.control_url) - closed
                cpu = cpu_ns([gateway.proc.pid])[0] - cpu
        finally:
            await gateway.stop()
    return cpu / 1e9, closed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=2_000, help="idle connections held (reopened when closed)")
    parser.add_argument("--sources", type=int, default=4, help="source addresses (127.0.0.2 on)")
    parser.add_argument("--deadline", type=float, default=1.0, help="grpc_handshake_timeout and header_read_timeout")
    parser.add_argument("--seconds", type=float, default=15.0, help="the measured window")
    parser.add_argument("--only", default="grpc,data", help="ports, in order: grpc,data")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(header("idle_churn", f"attack:       {args.connections} idle connections from {args.sources} addresses, "
                 f"reopened at once when closed; deadlines {args.deadline:g} s; {args.seconds:g} s measured",
                 installed=True), flush=True)
    for port in args.only.split(","):
        seconds, closed = asyncio.run(churn(port, args))
        per = f"{seconds / closed * 1e6:.0f} us" if closed else "- (none closed)"
        print(f"{port:5} closed at their deadline: {closed:.0f} in {args.seconds:g} s; gateway CPU {seconds:.2f} s: "
              f"{per} per connection", flush=True)
    print(footer())


if __name__ == "__main__":
    main()
