"""The gateway's instructions per unary gRPC call, counted by valgrind (callgrind): a figure load cannot move.

    .venv/bin/python benchmarks/grpc_instructions.py [--concurrency 1,10,50] [--calls 2000]
        [--stream-messages 20000] [--baseline /path/to/other/checkout] [--keep DIR]

``grpc_bench.py``'s set-up (a grpcio echo sandbox, a whole ``serve`` with its access log on, h2load on one
connection) with the gateway run under ``valgrind --tool=callgrind`` with counting off; for each concurrency,
after 200 unmetered calls, counting is switched on for ``--calls`` calls and the count divided by them. On a
machine shared with other work, CPU time per call moves by half with the neighbours' load (caches, frequency);
instruction counts do not. They count user space only: the kernel's part (syscalls, loopback TCP) is not in
them, and the gateway runs about 50 times slower, so at 10 and 50 in flight it takes calls in larger batches
than at full speed (read the c=1 figure for the path of one call, the others for its batched cost).
``--stream-messages N`` also counts 4 server streams of N messages each (grpclib's client, as grpc_bench's
streaming), per message. ``--baseline DIR`` counts a ``serve`` from that checkout the same way, after.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.grpc_bench import h2load_command, start_gateway, start_sandbox, streamed_messages  # noqa: E402
from benchmarks.harness import header, stop_procs  # noqa: E402


def count(checkout: Path | None, sandbox_port: int, concurrency: list[int], calls: int,
          stream_messages: int, keep: Path | None = None) -> dict[str, float]:
    """Instructions per call of one ``serve`` (from ``checkout``, else this one), by concurrency (``c=N``), and
    per streamed message (``stream``). With ``keep``, its callgrind dumps are moved there (callgrind_annotate)."""
    workdir = Path(tempfile.mkdtemp(prefix="grpc-instructions-"))
    received = 0
    out = workdir / "callgrind.out"
    gateway, host, port = start_gateway(workdir, sandbox_port, checkout, wait=600, prefix=(
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"))

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(gateway.pid)], check=True, capture_output=True)

    try:
        for level in concurrency:
            command = h2load_command(workdir, host, port, level)
            subprocess.run([*command[:2], "-n200", *command[2:]], check=True, capture_output=True)
            control("--zero")
            control("--instr=on")
            done = subprocess.run([*command[:2], f"-n{calls}", *command[2:]], check=True, capture_output=True,
                                  text=True)
            control("--instr=off")
            control(f"--dump=c{level}")
            if not re.search(rf"{calls} succeeded, 0 failed", done.stdout):
                raise RuntimeError(f"h2load: not every call succeeded:\n{done.stdout[-1500:]}")
        if stream_messages:
            asyncio.run(streamed_messages(host, port, 1, 100))
            control("--zero")
            control("--instr=on")
            received, _ = asyncio.run(streamed_messages(host, port, 4, stream_messages))
            control("--instr=off")
            control("--dump=stream")
    finally:
        stop_procs([gateway])
    figures = {}
    for dump in out.parent.glob(out.name + ".*"):
        text = dump.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: .*dump (c\d+|stream)$", text, re.M)
        totals = re.search(r"^totals: (\d+)", text, re.M)
        if trigger and totals:
            figures[trigger.group(1)] = int(totals.group(1)) / (calls if trigger.group(1) != "stream" else received)
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.move(dump, keep / f"callgrind.{'baseline.' if checkout else ''}{trigger.group(1)}")
    shutil.rmtree(workdir, ignore_errors=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,10,50", help="calls in flight, a comma-separated list")
    parser.add_argument("--calls", type=int, default=2000, help="counted calls per concurrency (default 2000)")
    parser.add_argument("--stream-messages", type=int, default=0,
                        help="also count 4 server streams of this many messages, per message")
    parser.add_argument("--baseline", type=Path, default=None, help="also count a serve from this checkout")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the callgrind dumps in this directory (for callgrind_annotate)")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "h2load"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (apt-get install valgrind nghttp2-client)")
    concurrency = [int(level) for level in args.concurrency.split(",")]
    print(header("grpc_instructions.py", installed=True))
    sandbox, sandbox_port = start_sandbox("grpcio")
    try:
        runs = [("gateway", None)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
        for name, checkout in runs:
            figures = count(checkout, sandbox_port, concurrency, args.calls, args.stream_messages, args.keep)
            print(f"{name:9} instructions per unary call: " + "   ".join(
                f"c={level} {figures.get(f'c{level}', float('nan')):,.0f}" for level in concurrency)
                + (f"; per streamed message {figures.get('stream', float('nan')):,.0f}" if args.stream_messages
                   else ""), flush=True)
    finally:
        stop_procs([sandbox])


if __name__ == "__main__":
    main()
