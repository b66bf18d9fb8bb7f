"""One real gateway for every hostile-input file in this package (tests/hostile/harness.py says what it is).

The gateway, and the event loop it is driven from, are package-scoped: starting it and binding the
reference identities takes seconds, and the last file (test_zz_afterwards.py) checks what the whole
table left behind. ``no_task_leaks`` is overridden to watch that package loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from gateway.auth import ADMIN_AUDIENCE, KeySet, issue_token
from tests.gateway_process import GatewayProcess
from tests.hostile.harness import (
    BOUNDARY, HEAD_TIMEOUT, LOOKALIKES, MAX_BODY, MAX_HEAD, POLICY, REFERENCES, SECRET, WALKER, Hostile,
)


@pytest_asyncio.fixture(loop_scope="package")
async def no_task_leaks() -> AsyncIterator[None]:
    """tests/conftest.py's check, on the package loop these tests run on."""
    before = asyncio.all_tasks()
    yield
    leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    assert not leaked, f"tasks leaked: {leaked}"


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Hostile]:
    root = tmp_path_factory.mktemp("hostile")
    (root / "policy.yaml").write_text(POLICY)
    (root / "keys.yaml").write_text(json.dumps({"keys": [{"kid": "admin", "alg": "HS256", "secret": SECRET}]}))
    process = await GatewayProcess(root / "gw", env={
        "SANDBOX_GATEWAY_AUTH_MODE": "trusted-headers",
        "SANDBOX_GATEWAY_AUTH_KEYS_FILE": str(root / "keys.yaml"),   # guards the control API
        "SANDBOX_GATEWAY_POLICY_FILE": str(root / "policy.yaml"),
        "SANDBOX_GATEWAY_MAX_HEADER_BYTES": str(MAX_HEAD),
        "SANDBOX_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY),
        "SANDBOX_GATEWAY_HEADER_READ_TIMEOUT": str(HEAD_TIMEOUT),
        "PER_SESSION_SANDBOX_ORG_IDS": "iso-org",
        "SANDBOX_GATEWAY_ALLOWED_HOSTS": "gw,gateway",  # the names the table's raw requests use
    }).start()
    key = KeySet.load(root / "keys.yaml").first()
    admin = {"Authorization": "Bearer " + issue_token(key, user="ops", audience=ADMIN_AUDIENCE)}
    http = aiohttp.ClientSession()
    state = Hostile(process, int(process.data_url.rsplit(":", 1)[1]), int(process.control_url.rsplit(":", 1)[1]),
                    http, admin)
    try:
        named = {"walker": WALKER, **REFERENCES, **BOUNDARY,
                 **{f"alike:{a.id}": a.identity for a in LOOKALIKES if a.bind}}
        ids = await asyncio.gather(*(state.bind(*identity) for identity in named.values()))
        state.bound = dict(zip(named, ids))
        yield state
    finally:
        await http.close()
        await process.stop()
