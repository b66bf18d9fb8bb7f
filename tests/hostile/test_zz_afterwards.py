"""After the whole hostile-input table (this file runs last in the package): the gateway survived,
nothing was created for rejected requests, nothing was logged as an internal error."""

from __future__ import annotations

import re

import pytest

from tests.hostile.harness import (
    W, Hostile, send,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")

async def test_zz_gateway_survived_the_table(gw: Hostile) -> None:
    assert gw.process.proc is not None and gw.process.proc.returncode is None, "the gateway process died"
    async with gw.http.get(f"{gw.control_url}/healthz") as response:
        assert response.status == 200 and await response.json() == {"status": "ok"}
    async with gw.http.get(f"{gw.control_url}/readyz") as response:
        assert response.status == 200, await response.text()
    response, _ = await send(gw.data_port, b"GET /echo/still-here HTTP/1.1\r\n" + W + b"\r\n")
    assert response is not None and response.status == 200
    assert response.json()["sandbox_id"] == gw.bound["walker"]


async def test_zz_nothing_created_for_rejected_requests(gw: Hostile) -> None:
    async with gw.http.get(f"{gw.control_url}/v1/sandboxes", headers=gw.admin) as response:
        assert response.status == 200
        listing = {s["sandbox_id"] for s in (await response.json())["sandboxes"]}
    unexpected = listing - gw.expected
    assert not unexpected, f"sandboxes no valid case asked for: {sorted(unexpected)}"
    leftovers = []
    for session in sorted(set(gw.rejected)):
        status, body = await gw.session_status(session)
        if status != 404:
            leftovers.append((session, body))
    assert not leftovers, f"rejected requests left bindings behind: {leftovers}"


async def test_zz_no_internal_error_was_logged(gw: Hostile) -> None:
    errors = [line for line in gw.process.log if re.search(r"\b(ERROR|CRITICAL)\b", line)]
    assert not errors, "\n".join(errors[:20])
