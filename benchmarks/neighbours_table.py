"""The figures of benchmarks/neighbours.py: the victim's p50/p99 and errors per port (``Result``), one attack's row
beside the baselines around it (``Row``), several rounds of it as one (``rounds_of``), and the table they print.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any


@dataclasses.dataclass
class Result:
    p50: float
    p99: float
    errors: int
    calls: int
    first_error: str = ""
    latencies: list[float] = dataclasses.field(default_factory=list, repr=False)  # seconds, sorted


def summary(latencies: list[float], errors: int, calls: int, first: str = "") -> Result:
    latencies = sorted(latencies)
    if not latencies:
        return Result(float("nan"), float("nan"), errors, calls, first)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return Result(statistics.median(latencies) * 1000, p99 * 1000, errors, calls, first, latencies)


def pooled(*results: Result) -> Result:
    """Several measurements of one port as one (the baselines just before and just after an attack)."""
    return summary([x for r in results for x in r.latencies], sum(r.errors for r in results),
                   sum(r.calls for r in results), next((r.first_error for r in results if r.first_error), ""))


@dataclasses.dataclass
class Row:
    scenario: str
    attacker: str                # what the attack did, in words
    results: dict[str, Result]   # the victim's, per port
    load: tuple[float, float, float]
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)  # what the attack did, for a test to assert
    before: dict[str, Result] = dataclasses.field(default_factory=dict)  # the victim's just before and after it
    ratios: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per round, when there were several


def median_of(results: list[Result]) -> Result:
    """Several rounds' measurements of one port: the median p50 and p99, every call and error counted."""
    return Result(statistics.median(r.p50 for r in results), statistics.median(r.p99 for r in results),
                  sum(r.errors for r in results), sum(r.calls for r in results),
                  next((r.first_error for r in results if r.first_error), ""))


def rounds_of(rounds: list[Row]) -> Row:
    """One row for several rounds of an attack; its ratio per port is the median of the rounds' own ratios
    (each against the baselines around it), and each round's ratio is listed with what the attack did."""
    ports = rounds[0].results
    ratios = {port: [r.results[port].p99 / r.before[port].p99 for r in rounds] for port in ports}
    listed = "; ".join(f"{port} {', '.join(f'{x:.2f}' for x in ratios[port])}" for port in ports)
    return Row(rounds[0].scenario, f"{rounds[-1].attacker}; p99 ratio per round: {listed}",
               {port: median_of([r.results[port] for r in rounds]) for port in ports}, rounds[-1].load,
               rounds[-1].facts, {port: median_of([r.before[port] for r in rounds]) for port in ports},
               ratios)


def table(rows: list[Row]) -> str:
    """The victim's figures per scenario and port: just before the attack and under it, the p99 ratio of the
    two; then what each attack did."""
    lines = ["| attack | victim port | baseline (before + after): p50 / p99 ms (calls) | under attack: p50 / p99 ms "
             "(calls) | p99 ratio | errors | load avg (1/5/15) |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        for port, r in row.results.items():
            pre = row.before.get(port)
            if port in row.ratios:
                ratio = f"{statistics.median(row.ratios[port]):.2f} (median of {len(row.ratios[port])})"
            else:
                ratio = f"{r.p99 / pre.p99:.2f}" if pre is not None and pre.p99 else "-"
            errors = f"{r.errors}/{r.calls}" + (f" ({r.first_error})" if r.errors else "")
            if pre is not None:
                errors += f" (baseline: {pre.errors}/{pre.calls})"
            before = f"{pre.p50:.2f} / {pre.p99:.2f} ({pre.calls})" if pre is not None else "-"
            lines.append(f"| {row.scenario} | {port} | {before} | {r.p50:.2f} / {r.p99:.2f} ({r.calls}) | {ratio} | "
                         f"{errors} | "
                         f"{row.load[0]:.2f} / {row.load[1]:.2f} / {row.load[2]:.2f} |")
    lines.append("")
    lines += [f"- {row.scenario}: {row.attacker}" for row in rows if row.attacker != "-"]
    return "\n".join(lines)
