"""The control API over real sockets, with real local sandbox processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from gateway.api import create_control_app
from gateway.metrics import Metrics
from gateway.model import Endpoint, Owner, SandboxRecord, SandboxState
from gateway.providers.base import PoolProviders
from gateway.providers.local import LocalProvider
from gateway.sessions import SessionRouter
from gateway.store.base import Caps
from gateway.store.memory import MemoryStore
from routing import default_policy
from tests.proxy_helpers import sandbox_http


@pytest.fixture
async def stack(tmp_path: Path):
    store = MemoryStore()
    local = LocalProvider(tmp_path, stop_on_close=True)
    provider = PoolProviders({"small": local, "shared": local})
    router = SessionRouter(store, provider, default_policy(["iso-org"]), replica_id="test")
    await provider.start(router.sandbox_lost)
    yield router, local
    await provider.close()
    await store.close()


@pytest.fixture
async def api(stack, aiohttp_client):
    router, _ = stack

    async def ready() -> list[str]:
        return []

    return await aiohttp_client(create_control_app(router, ready, Metrics()))


async def execute(http: aiohttp.ClientSession, endpoint: str, command: str) -> dict:
    if endpoint.startswith("unix:"):  # a confined local sandbox answers only on its Unix socket
        async with sandbox_http(endpoint) as (unix, base):
            return await execute(unix, base, command)
    async with http.post(f"{endpoint}/execute", json={"command": command}) as response:
        assert response.status == 200
        return await response.json()


async def bind(api, **identity) -> dict:
    response = await api.post("/v1/sessions", json=identity)
    assert response.status == 200, await response.text()
    return await response.json()


async def test_walkthrough_per_session_org_isolates_sessions(api):
    a = await bind(api, org_id="iso-org", user_id="alice", session_id="s-a")
    b = await bind(api, org_id="iso-org", user_id="alice", session_id="s-b")
    assert a["sandbox_id"] != b["sandbox_id"] and a["sandbox_id"].startswith("ses-")
    assert a["pool"] == "small" and a["state"] == "ready"
    async with aiohttp.ClientSession() as http:
        await execute(http, a["endpoint"], "echo secret > note.txt")
        seen_a = await execute(http, a["endpoint"], "cat note.txt")
        seen_b = await execute(http, b["endpoint"], "cat note.txt")
    assert seen_a["stdout"] == "secret\n"
    assert seen_b["exit_code"] != 0 and seen_b["stdout"] == ""


async def test_walkthrough_shared_org_shares_one_sandbox(api):
    a = await bind(api, org_id="team", user_id="bob", session_id="s-1")
    b = await bind(api, org_id="team", user_id="bob", session_id="s-2")
    assert a["sandbox_id"] == b["sandbox_id"] and a["sandbox_id"].startswith("org-")
    async with aiohttp.ClientSession() as http:
        await execute(http, a["endpoint"], "echo shared > note.txt")
        seen = await execute(http, b["endpoint"], "cat note.txt")
    assert seen["stdout"] == "shared\n"
    listing = await (await api.get("/v1/sandboxes")).json()
    assert [(s["sandbox_id"], s["sessions"], s["state"]) for s in listing["sandboxes"]] == [(a["sandbox_id"], 2, "ready")]


async def test_get_and_delete_session(api, stack):
    _, local = stack
    a = await bind(api, org_id="iso-org", user_id="carol", session_id="s-x")
    got = await (await api.get("/v1/sessions/s-x")).json()
    assert got["sandbox_id"] == a["sandbox_id"]
    foreign = await api.get("/v1/sessions/s-x", headers={"X-User-Id": "mallory", "X-Org-Id": "iso-org"})
    assert foreign.status == 404
    deleted = await api.delete("/v1/sessions/s-x")
    assert (await deleted.json())["deleted"] is True
    assert await local.list_managed() == []  # the ses- sandbox went with its session
    missing = await api.get("/v1/sessions/s-x")
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "not_found"


async def test_route_dry_run_creates_nothing(api, stack):
    _, local = stack
    response = await api.get("/v1/route", params={"org_id": "iso-org", "user_id": "u", "session_id": "agent_abc"})
    body = await response.json()
    assert body["sandbox_id"].startswith("ses-") and body["pool"] == "small"
    assert await local.list_managed() == []


async def test_killed_sandbox_is_recreated_on_next_bind(api, stack, tmp_path):
    router, local = stack
    first = await bind(api, org_id="iso-org", user_id="dave", session_id="s-k")
    state = json.loads((tmp_path / "sandboxes" / first["sandbox_id"] / "state.json").read_text())
    released = asyncio.Event()
    router.store.subscribe(lambda key: released.set() if key == first["sandbox_id"] else None)
    os.kill(state["pid"], signal.SIGKILL)
    await released.wait()  # the provider noticed the death through its pidfd
    again = await bind(api, org_id="iso-org", user_id="dave", session_id="s-k")
    assert again["sandbox_id"] == first["sandbox_id"] and again["endpoint"] != first["endpoint"]
    async with aiohttp.ClientSession() as http:
        assert (await execute(http, again["endpoint"], "echo back"))["stdout"] == "back\n"


LONG = "x" * 300


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), [
    pytest.param("POST", "/v1/sessions", {"session_id": "s"}, 400, "invalid_identity", id="missing user"),
    pytest.param("POST", "/v1/sessions", {"user_id": "u", "session_id": ""}, 400, "invalid_identity", id="empty session"),
    pytest.param("POST", "/v1/sessions", {"user_id": "u\n", "session_id": "s"}, 400, "invalid_identity", id="control character"),
    pytest.param("POST", "/v1/sessions", {"user_id": "u", "session_id": LONG}, 400, "invalid_identity", id="300-char session"),
    pytest.param("POST", "/v1/sessions", {"user_id": 7, "session_id": "s"}, 400, "invalid_identity", id="non-string user"),
    pytest.param("POST", "/v1/sessions", {"user_id": "u", "session_id": "s", "role": "admin"}, 400, "bad_request", id="unknown field"),
    pytest.param("POST", "/v1/sessions", b"{not json", 400, "invalid_json", id="malformed JSON"),
    pytest.param("POST", "/v1/sessions", b"[1, 2]", 400, "invalid_json", id="JSON array"),
    pytest.param("POST", "/v1/sessions", b"", 400, "invalid_json", id="empty body"),
    pytest.param("GET", "/v1/sessions/unknown", None, 404, "not_found", id="unknown session"),
    pytest.param("DELETE", "/v1/sessions/unknown", None, 404, "not_found", id="delete unknown session"),
    pytest.param("GET", f"/v1/sessions/{LONG}", None, 400, "invalid_identity", id="300-char path session"),
    pytest.param("GET", "/v1/sessions/%01", None, 400, "invalid_identity", id="control character in path"),
    pytest.param("GET", "/v1/route?user_id=u", None, 400, "invalid_identity", id="dry run without session"),
    pytest.param("GET", "/v1/route?user_id=u&session_id=s&admin=1", None, 400, "bad_request", id="dry run unknown param"),
    pytest.param("GET", "/v1/nope", None, 404, "not_found", id="unknown route"),
    pytest.param("PUT", "/v1/sessions", b"{}", 405, "method_not_allowed", id="wrong method"),
    pytest.param("POST", "/v1/sessions", b"{" + b" " * 70_000 + b"}", 413, "payload_too_large", id="oversized body"),
    pytest.param("POST", "/v1/sessions", b"[" * 5000 + b"]" * 5000, 400, "invalid_json", id="deeply nested JSON"),
    pytest.param("POST", "/v1/sessions", b'{"user_id": "u", "session_id": "s", "user_id": "v"}', 400, "invalid_json",
                 id="duplicated field"),
    pytest.param("POST", "/v1/sessions", {"user_id": "\u202eemca", "session_id": "s"}, 400, "invalid_identity",
                 id="bidi override"),
    pytest.param("POST", "/v1/sessions", ("text/plain", b'{"user_id": "u", "session_id": "s"}'), 415,
                 "unsupported_media_type", id="JSON sent as text/plain (cross-site form post)"),
    pytest.param("GET", "/v1/route?user_id=u&user_id=v&session_id=s", None, 400, "invalid_identity",
                 id="dry run repeated param"),
    pytest.param("POST", "/v1/sandboxes/org-0a/suspend", None, 404, "not_found", id="suspend unknown sandbox"),
    pytest.param("POST", "/v1/sandboxes/org-0a/resume", None, 404, "not_found", id="resume unknown sandbox"),
    pytest.param("POST", "/v1/sandboxes/..%2Fetc/suspend", None, 400, "bad_request", id="suspend a non-ID"),
    pytest.param("GET", "/v1/sandboxes/org-0a/suspend", None, 405, "method_not_allowed", id="suspend by GET"),
    pytest.param("DELETE", "/v1/sandboxes/org-0a", None, 404, "not_found", id="delete unknown sandbox"),
    pytest.param("DELETE", "/v1/sandboxes/..%2Fetc", None, 400, "bad_request", id="delete a non-ID"),
])
async def test_bad_input_gets_documented_json_error(api, stack, method, path, body, status, code):
    _, local = stack
    if isinstance(body, dict):
        kwargs = {"json": body}
    elif isinstance(body, tuple):
        kwargs = {"data": body[1], "headers": {"Content-Type": body[0]}}
    else:
        kwargs = {"data": body, "headers": {"Content-Type": "application/json"}}
    response = await api.request(method, path, **kwargs)
    assert response.status == status
    payload = await response.json()
    assert payload["error"]["code"] == code and payload["error"]["message"]
    assert await local.list_managed() == []


async def test_an_admin_deletes_a_shared_sandbox(api, stack):
    """A session's DELETE only unbinds from a shared (org-/usr-) sandbox: DELETE /v1/sandboxes/{id}
    destroys it; its sessions stay bound and the next use creates it afresh."""
    _, local = stack
    a = await bind(api, org_id="team", user_id="bob", session_id="s-1")
    await bind(api, org_id="team", user_id="bob", session_id="s-2")
    assert (await (await api.delete("/v1/sessions/s-1")).json())["deleted"] is True
    assert len(await local.list_managed()) == 1  # unbinding left the shared sandbox up
    deleted = await api.delete(f"/v1/sandboxes/{a['sandbox_id']}")
    assert deleted.status == 200, await deleted.text()
    assert (await deleted.json())["deleted"] is True and (await deleted.json())["sandbox_id"] == a["sandbox_id"]
    assert await local.list_managed() == []
    assert (await (await api.get("/v1/sandboxes")).json())["sandboxes"] == []
    assert (await api.get("/v1/sessions/s-2")).status == 200  # still bound
    again = await bind(api, org_id="team", user_id="bob", session_id="s-2")
    assert again["sandbox_id"] == a["sandbox_id"] and again["state"] == "ready"
    assert (await api.delete(f"/v1/sandboxes/{a['sandbox_id']}")).status == 200


@pytest.mark.parametrize(("redis_url", "stops"), [(None, True), ("", True), ("redis://127.0.0.1:1/0", False)])
def test_local_sandboxes_outlive_the_gateway_only_with_a_shared_store(redis_url, stops):
    """An empty REDIS_URL means the memory store; its local sandboxes must not be left behind as orphans."""
    from gateway.app import build_providers
    from gateway.settings import Settings

    settings = Settings(redis_url=redis_url)
    local = build_providers(settings, default_policy()).for_pool("shared")
    assert settings.store_kind == ("memory" if stops else "redis")
    assert local._stop_on_close is stops


async def test_sandbox_listing_pages_with_a_cursor_and_filters(api, stack):
    router, _ = stack
    # Records straight through the store: listing is about the index, not about processes.
    for i in range(5):
        record = SandboxRecord(f"org-{i}", "shared" if i % 2 else "small", "acme" if i < 3 else None,
                               SandboxState.CREATING, created_at=1.0, owner=Owner("acme", "u", None))
        await router.store.reserve_sandbox(record, Caps(), 30)
        if i != 4:
            await router.store.mark_ready(record.sandbox_id, Endpoint("127.0.0.1", 9))
        # Activity after now: becoming ready is activity, and touch only moves it forward.
        await router.store.touch({record.sandbox_id: time.time() + 3600 + i}, {})
    seen, cursor = [], None
    while True:
        params = {"limit": "2"} if cursor is None else {"limit": "2", "cursor": cursor}
        body = await (await api.get("/v1/sandboxes", params=params)).json()
        assert len(body["sandboxes"]) <= 2
        seen += [s["sandbox_id"] for s in body["sandboxes"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"org-{i}" for i in range(5)]
    filtered = await (await api.get("/v1/sandboxes", params={"pool": "small", "state": "ready", "org": "acme"})).json()
    assert [s["sandbox_id"] for s in filtered["sandboxes"]] == ["org-0", "org-2"]
    assert filtered["next_cursor"] is None and filtered["sandboxes"][0]["org_id"] == "acme"


@pytest.mark.parametrize(("query", "names"), [
    pytest.param("limit=0", "limit", id="limit zero"),
    pytest.param("limit=1001", "limit", id="limit over the max"),
    pytest.param("limit=ten", "limit", id="limit not a number"),
    pytest.param("limit=%C2%B2", "limit", id="limit a unicode digit"),
    pytest.param("cursor=not-a-cursor", "cursor", id="cursor garbage"),
    pytest.param("cursor=WzEsMl0", "cursor", id="cursor of the wrong shape"),
    pytest.param("state=asleep", "state", id="unknown state"),
    pytest.param("limit=1&limit=2", "limit", id="repeated"),
    pytest.param("sort=name", "sort", id="unknown parameter"),
    pytest.param("pool=nope", "pool 'nope' is not in the policy (pools: small, shared)", id="unknown pool"),
])
async def test_sandbox_listing_refuses_bad_parameters(api, query, names):
    response = await api.get(f"/v1/sandboxes?{query}")
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["code"] == "bad_request" and names in error["message"]
