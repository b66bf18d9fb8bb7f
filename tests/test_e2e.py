"""The README walkthrough and lifecycle against a real ``sandbox-gateway serve``."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.gateway_process import GatewayProcess
from tests.proxy_helpers import eventually

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture
async def gateway(tmp_path: Path):
    process = await GatewayProcess(tmp_path / "gw", env={"PER_SESSION_SANDBOX_ORG_IDS": "iso-org"}).start()
    yield process
    await process.stop()


def headers(org: str, user: str, session: str) -> dict[str, str]:
    return {"X-Org-Id": org, "X-User-Id": user, "X-Session-Id": session}


async def run(http: aiohttp.ClientSession, base: str, hdrs: dict[str, str], command: str) -> dict:
    async with http.post(f"{base}/execute", headers=hdrs, data=json.dumps({"command": command})) as response:
        assert response.status == 200, await response.text()
        return await response.json(content_type=None)


def readme_commands() -> list[tuple[dict[str, str], str, str | None]]:
    """(headers, command, expected stdout) for every curl line of the README walkthrough."""
    text = README.read_text()
    sessions = {name: dict(re.findall(r"'(X-[\w-]+): ([^']+)'", body))
                for name, body in re.findall(r"^(\w+)=\((.*)\)$", text, re.MULTILINE)}
    steps = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        match = re.match(r'curl -s "\$\{(\w+)\[@\]\}" localhost:8080/execute -d \'(.*)\'$', line)
        if match:
            expected = None
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if following.startswith("# {"):
                expected = json.loads(following[2:])["stdout"]
            steps.append((sessions[match.group(1)], json.loads(match.group(2))["command"], expected))
    return steps


async def test_readme_walkthrough_as_written(gateway):
    steps = readme_commands()
    assert len(steps) == 5, "the README walkthrough changed shape; update this test with it"
    async with aiohttp.ClientSession() as http:
        for hdrs, command, expected in steps:
            result = await run(http, gateway.data_url, hdrs, command)
            if expected is not None:
                assert result["stdout"] == expected, (command, result)
        listing = await (await http.get(f"{gateway.control_url}/v1/sandboxes")).json()
    by_prefix = sorted(s["sandbox_id"][:3] for s in listing["sandboxes"])
    assert by_prefix == ["org", "ses", "ses"]


async def test_control_api_and_data_plane_agree(gateway):
    async with aiohttp.ClientSession() as http:
        bound = await (await http.post(f"{gateway.control_url}/v1/sessions",
                                       json={"org_id": "iso-org", "user_id": "u", "session_id": "c1"})).json()
        async with http.get(f"{gateway.data_url}/", headers=headers("iso-org", "u", "c1")) as response:
            assert (await response.json())["sandbox_id"] == bound["sandbox_id"]
        async with http.get(f"{gateway.data_url}/", headers=headers("iso-org", "mallory", "c1")) as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "not_found"
        async with http.get(f"{gateway.data_url}/", headers={"X-Session-Id": "c1"}) as response:
            assert response.status == 400 and "X-User-Id" in (await response.json())["error"]["message"]


async def test_one_access_line_per_request(gateway):
    """Access lines are written in batches, a few times a second: each request gets exactly one."""
    async with aiohttp.ClientSession() as http:
        for n in range(3):
            hdrs = {**headers("acme", "u", "a1"), "X-Request-Id": f"access-test-{n}"}
            async with http.get(f"{gateway.data_url}/", headers=hdrs) as response:
                assert response.status == 200
        async with http.get(f"{gateway.data_url}/", headers={"X-Request-Id": "access-test-bad"}) as response:
            assert response.status == 400

    def lines() -> list[str]:
        return [line for line in gateway.log if "gateway.access: " in line and "request_id=access-test-" in line]

    await eventually(lambda: len(lines()) == 4)
    first = lines()[0]
    assert " INFO    gateway.access: GET / 200 bytes_in=0 bytes_out=" in first
    assert re.search(r" duration_ms=\d+\.\d\d upstream_ms=\d+\.\d\d request_id=access-test-0 session_id=a1 "
                     r"org_id=acme sandbox_id=org-\w+ pool=shared protocol=http error=-$", first), first
    assert re.search(r"GET / 400 .* request_id=access-test-bad session_id=- org_id=- sandbox_id=- pool=- "
                     r"protocol=http error=invalid_identity$", lines()[3]), lines()[3]


async def test_sigterm_drains_an_in_flight_request(tmp_path):
    process = await GatewayProcess(tmp_path / "gw").start()
    async with aiohttp.ClientSession() as http:
        await run(http, process.data_url, headers("o", "u", "d1"), "true")  # sandbox exists
        slow = asyncio.create_task(run(http, process.data_url, headers("o", "u", "d1"), "sleep 1; echo done"))
        await asyncio.sleep(0.3)  # the slow request is in flight (no event exists for "sent")
        stopping = asyncio.create_task(process.stop(signal.SIGTERM))
        assert (await slow)["stdout"] == "done\n"
        assert await stopping == 0
    assert any("draining" in line for line in process.log)
    sandboxes = tmp_path / "gw" / ".sandbox-gateway" / "sandboxes"
    assert not sandboxes.exists() or not any(sandboxes.iterdir()), "a memory-store gateway stops its sandboxes"


async def test_metrics_after_traffic_cover_the_dashboard(tmp_path):
    """Scrape a live gateway after traffic: the counters moved, and every metric the dashboard
    queries is exported (histograms and counters by their base name)."""
    process = await GatewayProcess(tmp_path / "gw", env={"PER_SESSION_SANDBOX_ORG_IDS": "iso-org",
                                                         "SANDBOX_GATEWAY_PER_ORG_METRICS": "true"}).start()
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(3):
                await run(http, process.data_url, headers("iso-org", "u", "m1"), "true")
            text = await (await http.get(f"{process.control_url}/metrics")).text()
    finally:
        await process.stop()
    assert 'sgw_requests_total{pool="small",protocol="http",status="2xx"} 3.0' in text
    assert 'sgw_route_cache_total{result="hit"} 2.0' in text
    assert 'sgw_provisions_total{outcome="ready",pool="small"} 1.0' in text
    assert 'sgw_org_requests_total{org="iso-org",status="2xx"} 3.0' in text
    dashboard = (README.parent / "helm" / "sandbox-gateway" / "dashboards" / "sandbox-gateway.json").read_text()
    used = set(re.findall(r"sgw_[a-z_]+", dashboard))
    exported = set(re.findall(r"^# TYPE (sgw_[a-z_]+) ", text, re.MULTILINE))
    base = {re.sub(r"_(bucket|sum|count|total)$", "", name) for name in used}
    missing = {name for name in base if name not in exported and f"{name}_total" not in exported
               and name.removesuffix("_total") not in exported}
    assert not missing, f"the dashboard queries metrics the gateway does not export: {sorted(missing)}"


def test_bad_settings_exit_2_with_one_line(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--data-port", "70000"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--data-port / SANDBOX_GATEWAY_DATA_PORT" in result.stderr


async def test_a_second_gateway_on_the_same_port_is_refused(gateway, tmp_path):
    """SO_REUSEPORT would let it bind next to the first, with its own session map: exit 2 instead."""
    import sys

    port = gateway.data_url.rsplit(":", 1)[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--data-port", port, "--control-port", "0", "--grpc-port", "0",
        "--log-format", "text", cwd=tmp_path, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in stderr.decode()
    async with aiohttp.ClientSession() as http:  # the first one is unaffected
        async with http.get(f"{gateway.control_url}/healthz") as response:
            assert response.status == 200
