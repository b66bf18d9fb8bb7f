"""Soak: the chaos scenario of tests/chaos, longer and bigger, with its report printed.

3 ``serve`` replicas on one real redis-server, local and fake-Kubernetes sandboxes, steady load
from many sessions across several orgs, while the fault driver kills replicas, restarts Redis
with and without persistence, kills sandbox processes (creator alive and dead), drops watches and
deletes Kubernetes sandboxes behind the gateway's back, with standing static pools that stall or
refuse. Exits 1 when a zero is not zero (unexpected errors, wrong owner, sessions lost with
persistence, duplicated or leaked sandboxes).

    .venv/bin/python benchmarks/soak.py --rounds 10 --isolated 20 --kube 40 --workers 16
    .venv/bin/python benchmarks/soak.py --minutes 30     # rounds until the time is up

Needs redis-server (and bubblewrap for confined local sandboxes, as serve does). Run it from the
checkout. The figures are the machine's: on a shared 2-core host, compare p99s within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.scenario import Scale, run  # noqa: E402


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Scale]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Scale(isolated=12, shared_users=4, per_user=4, kube=24, stalled=2, refused=2, workers=16,
                     steady=30.0, gap=10.0, rounds=5, slow_command="sleep 2")
    for item in dataclasses.fields(Scale):
        value = getattr(defaults, item.name)
        parser.add_argument(f"--{item.name.replace('_', '-')}", type=type(value), default=value,
                            help=f"(default: {value})")
    parser.add_argument("--minutes", type=float, default=None,
                        help="run fault rounds until this many minutes have passed (overrides --rounds)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the replicas, Redis and sandboxes live and the replicas' logs are kept "
                             "(default: a fresh temporary directory, kept)")
    args = parser.parse_args(argv)
    scale = Scale(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Scale)})
    return args, scale


def main(argv: list[str] | None = None) -> int:
    args, scale = parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="soak-"))
    if args.minutes is not None:
        scale = dataclasses.replace(scale, rounds=0, duration=args.minutes * 60)
    from benchmarks.harness import reported

    with reported("soak.py"):
        print(f"soak: {scale}\n  in {root} (replica logs: {root}/gw*.log)", flush=True)
        report = asyncio.run(run(root, scale))
        print(report.render())
    return 0 if report.zeros_hold() else 1


if __name__ == "__main__":
    sys.exit(main())
