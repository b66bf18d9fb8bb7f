"""h2spec (the HTTP/2 conformance suite) against the gRPC front, h2c and TLS: every case it fails must be
one of the documented deviations (docs/deployment.md, "HTTP/2 conformance (h2spec)"), each with its reason.

h2spec is not part of the project: the test finds it through ``H2SPEC`` (scripts/test sets it to
../shared/tools/h2spec when that exists) and is skipped, saying why, without it.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from tests.grpc_helpers import grpc_gateway, static_policy
from tests.test_grpc_grpcio import _self_signed

H2SPEC = os.environ.get("H2SPEC", "")
DOCS = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"
GROUPS = {"Generic tests for HTTP/2 server": "generic", "Hypertext Transfer Protocol Version 2 (HTTP/2)": "http2",
          "HPACK: Header Compression for HTTP/2": "hpack"}
_SECTION = re.compile(r"^\s+(\d+(?:\.\d+)*)\. ")
_FAILED = re.compile(r"^\s+× (\d+): (.*)")
_SUMMARY = re.compile(r"(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed")

needs_h2spec = pytest.mark.skipif(not (H2SPEC and os.access(H2SPEC, os.X_OK)),
                                reason="h2spec not found: set H2SPEC to the h2spec binary (scripts/test sets "
                                       "it to ../shared/tools/h2spec when that exists)")


def failures(output: str) -> dict[str, str]:
    """The failed cases in h2spec's report, as ``group/section/case`` (``http2/6.9.1/2``): their description."""
    found: dict[str, str] = {}
    group = section = ""
    for line in output.splitlines():
        if line.strip() in GROUPS:
            group = GROUPS[line.strip()]
        elif (match := _FAILED.match(line)) is not None:
            found[f"{group}/{section}/{match.group(1)}"] = match.group(2).strip()
        elif (match := _SECTION.match(line)) is not None:
            section = match.group(1)
    return found


def deviations() -> dict[str, str]:
    """The documented deviations: the rows of the table under the h2spec heading in docs/deployment.md."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("### HTTP/2 conformance (h2spec)")
    rows: dict[str, str] = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"`?(generic|http2|hpack)/[\d.]+/\d+`?", cells[0]):
            rows[cells[0].strip("`")] = cells[-1]
    return rows


async def run_h2spec(port: int, *tls: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        H2SPEC, "-h", "127.0.0.1", "-p", str(port), "-o", "3", *tls,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 600)
    return out.decode("utf-8", "replace")


@needs_h2spec
@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "tls"])
async def test_h2spec_finds_nothing_but_the_documented_deviations(tmp_path, tls):
    settings = {}
    if tls:
        cert, key = _self_signed(tmp_path)
        settings = {"grpc_tls_cert_file": cert, "grpc_tls_key_file": key}
    policy = static_policy(tmp_path / "p.yaml", ["127.0.0.1"], 9)  # no request reaches a sandbox: none is run
    async with grpc_gateway(tmp_path, policy, **settings) as gw:
        output = await run_h2spec(gw.grpc_address[1], *(["-t", "-k"] if tls else []))
    summary = _SUMMARY.search(output)
    assert summary is not None, f"h2spec did not finish:\n{output[-3000:]}"
    failed = failures(output)
    assert len(failed) == int(summary.group(4)), f"the report was not read as it is:\n{output[-3000:]}"
    documented = deviations()
    unexplained = {case: what for case, what in failed.items() if case not in documented}
    assert not unexplained, (f"h2spec failures not documented in {DOCS.name}: {unexplained}\n"
                             f"{output[output.find('Failures:'):][:6000]}")
    print(f"h2spec ({'tls' if tls else 'h2c'}): {summary.group(0)}; documented deviations: {sorted(failed)}")


def test_every_documented_deviation_has_a_reason():
    rows = deviations()
    assert all(len(reason) > 20 for reason in rows.values()), rows
