"""The user CPU the gateway's own code spends per proxied request, without sockets or other processes.

    .venv/bin/python benchmarks/hotpath_bench.py [--requests N] [--repeat R]

The whole ``serve`` wiring (``gateway.app.Gateway``: the session layer's route cache and owner
check, the authenticator, admission, the metrics batch and the access log, JSON, to /dev/null)
with its data plane driven by hand: a client connection and one pooled upstream connection whose
transports only keep what is written to them. Each request is the head wrk sends in
``proxy_bench.py --serve`` fed to the client connection, then nginx's answer to it fed to the
upstream connection, so every callback, the head rewrites, the route lookup and the per-request
bookkeeping run as they do under load, and nothing else does: no syscalls, no event loop
between them, no wrk or backend sharing the cores.

What it prints is user CPU time per request (``getrusage``), the median of ``--repeat`` runs.
It leaves out what ``proxy_bench.py`` measures on top (the kernel's reads and writes, uvloop,
the access log's batched write), so it is a lower bound of the gateway's share there, but it
moves by a few percent between runs on a loaded machine where req/s moves by 2x: use it to
compare two checkouts (run each in turn, ``PYTHONPATH=<checkout>`` chooses which gateway is
imported) or the two builds (``SANDBOX_GATEWAY_PURE_PYTHON=1``).

``--fixed-clock`` is for instruction counts (valgrind): the plane's ``perf_counter`` and the access
log's wall clock are replaced by counters that advance a fixed step a call, so what follows the time
(the access line's millisecond stamp, formatted once a millisecond; the durations' digits and
histogram buckets) is the same in every run, and two runs' counts differ only by the code. Without
it, a request under valgrind takes about a millisecond and the count moves by ~3k between runs of
one build. The counters are C callables (``itertools.count().__next__``): no Python frame added.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import resource
import socket
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: a checkout given there is the one measured

from benchmarks.harness import footer, header  # noqa: E402

UPSTREAM_PORT = 9  # never connected to: the pool holds a connection to it already
REQUEST = (b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
           b"X-User-Id: bench-user\r\nX-Session-Id: bench-session\r\n\r\n")
RESPONSE = (b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 15:00:00 GMT\r\n"
            b"Content-Type: text/html\r\nContent-Length: 13\r\nLast-Modified: Fri, 27 Nov 2026 14:00:00 GMT\r\n"
            b"Connection: keep-alive\r\nETag: \"6925f0b0-d\"\r\nAccept-Ranges: bytes\r\n\r\nhello, world\n")


class Transport:
    """Keeps what is written; every other transport call is accepted and does nothing."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def writelines(self, lines: list[bytes]) -> None:
        self.out.extend(lines)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    return sock


def fix_clocks() -> None:
    """Deterministic clocks for the plane's durations and the access log's stamp (see ``--fixed-clock``):
    10 us a ``perf_counter`` call, 0.1 ms a log line (a new stamp every ten lines)."""
    from gateway import logs
    from gateway.proxy import _downstream, _state, _upstream

    perf = itertools.count(1000.0, 0.00001).__next__
    for module in (_downstream, _state, _upstream):
        module.perf_counter = perf  # type: ignore[attr-defined]
    logs._time = itertools.count(1_800_000_000.0, 0.0001).__next__  # type: ignore[attr-defined]


async def measure(requests: int, repeat: int, tmp: Path) -> list[float]:
    from gateway.app import Gateway
    from gateway.logs import AccessLog
    from gateway.proxy._downstream import DownstreamConnection
    from gateway.proxy._upstream import UpstreamConnection, UpstreamPool
    from gateway.settings import Settings

    policy = tmp / "policy.yaml"
    upstream = f"http://127.0.0.1:{UPSTREAM_PORT}"
    policy.write_text(f"pools: {{small: {{provider: static, upstreams: ['{upstream}']}}, "
                      f"shared: {{provider: static, upstreams: ['{upstream}']}}}}\n")  # as proxy_bench's
    with open("/dev/null", "w") as sink:
        gateway = Gateway.create(Settings(policy_file=policy, data_dir=tmp / "data", data_port=0, control_port=0),
                                 AccessLog(sink, json_lines=True))
        await gateway.start(_listening(), _listening())
        try:
            plane = gateway.data_plane
            pool = plane.pools[("127.0.0.1", UPSTREAM_PORT)] = UpstreamPool(plane, "127.0.0.1", UPSTREAM_PORT, 256)
            upstream = UpstreamConnection(plane, pool)
            up_tr = Transport()
            upstream.connection_made(up_tr)
            pool.release(upstream)
            client = DownstreamConnection(plane)
            client_tr = Transport()
            client.connection_made(client_tr)
            client.data_received(REQUEST)  # the first one resolves (a task): the route is cached after it
            for _ in range(50):
                await asyncio.sleep(0)
                if up_tr.out:
                    break
            if not up_tr.out:
                raise SystemExit("the first request never reached the upstream")
            upstream.data_received(RESPONSE)
            results = []
            for round_ in range(repeat + 1):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_utime
                for i in range(requests):
                    client.data_received(REQUEST)
                    upstream.data_received(RESPONSE)
                    if i & 255 == 0:
                        up_tr.out.clear()
                        client_tr.out.clear()
                after = resource.getrusage(resource.RUSAGE_SELF).ru_utime
                await asyncio.sleep(0)  # the callbacks the loop owes (metrics, log flushes) run between rounds
                if round_:  # the first round warms up
                    results.append((after - before) / requests * 1e6)
            last = b"".join(client_tr.out)
            if not last.endswith(b"hello, world\n") or b" 200 OK" not in last:
                raise SystemExit(f"unexpected response through the plane: {last[-300:]!r}")
            return results
        finally:
            await gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=50_000, help="requests per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the median is shown")
    parser.add_argument("--fixed-clock", action="store_true",
                        help="clocks that advance a fixed step a call: instruction counts that do not follow wall time")
    args = parser.parse_args()
    print(header("hotpath_bench.py (user CPU of the gateway's code per request, no sockets)"), flush=True)
    import uvloop

    if args.fixed_clock:
        fix_clocks()
    with tempfile.TemporaryDirectory() as tmp:
        results = uvloop.run(measure(args.requests, args.repeat, Path(tmp)))
    print(f"user CPU per request: median {statistics.median(results):.2f} us "
          f"(runs: {', '.join(f'{r:.2f}' for r in results)})")
    print(footer())


if __name__ == "__main__":
    main()
