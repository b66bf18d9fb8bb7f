"""Loop turns of the gateway while neighbours.py's victim was measured (benchmarks/loop_probe/sitecustomize.py).

    .venv/bin/python benchmarks/loop_probe/report.py DIR [--victim N] [--turns MS]

DIR holds the probe's files (``probe.<pid>``, the gateway's is the largest) and ``calls`` (neighbours.py
``--calls-log``), from a run of one attack, one round: after the warm-up (20 calls per port) come the
baseline before, the attack and the baseline after, ``--victim`` calls per port each. For each window: the
loop turns over 1, 2 and 5 ms of CPU, per 10 s, the largest, and what the GC and the data plane's clock
took in them; with ``--turns MS`` every turn over MS ms during the attack.
"""

from __future__ import annotations

import argparse
import glob
import re
from pathlib import Path


Turn = tuple[float, float, int, dict[str, str]]  # wall clock, CPU ms, accepts, what took CPU in it (ms)


def read_turns(directory: Path) -> list[Turn]:
    probe = max(glob.glob(str(directory / "probe.*")), key=lambda p: Path(p).stat().st_size)
    turns = []
    for line in Path(probe).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            t, ms, n, *rest = line.split(None, 3)
            turns.append((float(t), float(ms), int(n), dict(re.findall(r"(\w+)=([\d.]+)", rest[0] if rest else ""))))
    return turns


def window(name: str, part: list[list[str]], turns: list[Turn], show: float | None) -> None:
    start, end = float(part[0][0]), float(part[-1][0]) + float(part[-1][1]) / 1e3
    seconds = end - start
    inside = [x for x in turns if start <= x[0] <= end]
    over = [sum(1 for x in inside if x[1] > ms) for ms in (1, 2, 5)]
    spent: dict[str, float] = {}
    for x in inside:
        for k, v in x[3].items():
            spent[k] = spent.get(k, 0.0) + float(v)
    largest = max((x[1] for x in inside), default=0.0)
    print(f"{name}: {seconds:.1f} s; turns over 1/2/5 ms: {'/'.join(map(str, over))} "
          f"({'/'.join(f'{c * 10 / seconds:.1f}' for c in over)} per 10 s); largest {largest:.1f} ms; "
          "in turns over 0.5 ms: " + ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(spent.items())))
    for t, ms, acc, parts in inside if show is not None else ():
        if ms > show:
            print(f"   {t - start:7.3f} s  {ms:6.2f} ms  accepts {acc:3d}  " + " ".join(f"{k}={v}" for k, v in parts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--victim", type=int, default=1000)
    parser.add_argument("--turns", type=float)
    args = parser.parse_args()
    turns = read_turns(args.dir)
    calls = [line.split() for line in (args.dir / "calls").read_text(encoding="utf-8").splitlines()]
    n, warm = args.victim, 60
    for name, part in (("before", calls[warm:warm + 3 * n]), ("attack", calls[warm + 3 * n:warm + 6 * n]),
                       ("after", calls[warm + 6 * n:warm + 9 * n])):
        if part:
            window(name, part, turns, args.turns if name == "attack" else None)


if __name__ == "__main__":
    main()
