"""The agent-sandbox router's headers: off by default; when on, admin token + namespace and port allow-lists."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client

from gateway.auth import ADMIN_AUDIENCE, AdminTokens, KeySet, issue_token
from gateway.compat import RouterCompat
from gateway.errors import BadRequest, Forbidden, Unauthorized
from gateway.settings import Settings
from routing import Identity
from routing.placement import place
from routing.policy import default_policy
from tests.fakekube.fixtures import make_fake_kube  # noqa: F401  (a fixture)
from tests.fakekube.helpers import SBX, sandbox
from tests.gateway_process import GatewayProcess
from tests.proxy_helpers import aiohttp_backend, echo_headers

SECRET = "compat-test-secret-of-at-least-32-bytes!"


@pytest.fixture
def keyfile(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text(json.dumps({"keys": [{"kid": "k1", "alg": "HS256", "secret": SECRET}]}))
    return path


def bearer(keyfile: Path, audience: str = ADMIN_AUDIENCE) -> str:
    return "Bearer " + issue_token(KeySet.load(keyfile).get("k1"), user="ops", audience=audience)


class NoLocator:
    async def locate(self, namespace: str, name: str) -> str:
        raise AssertionError("a refused request must not reach the Kubernetes API")


@pytest.mark.parametrize("headers, error, code", [
    pytest.param((b"sbx", b"agents", b"8888", None), Unauthorized, "unauthorized", id="no token"),
    pytest.param((b"sbx", b"kube-system", b"22", None), Unauthorized, "unauthorized",
                 id="no token: the allow-lists are not revealed"),
    pytest.param((b"sbx", b"kube-system", None, "admin"), Forbidden, "namespace_not_allowed", id="namespace"),
    pytest.param((b"sbx", None, None, "admin"), Forbidden, "namespace_not_allowed", id="default namespace"),
    pytest.param((b"sbx", b"agents", b"22", "admin"), Forbidden, "port_not_allowed", id="port"),
    pytest.param((b"sbx", b"agents", b"80x", "admin"), BadRequest, "invalid_sandbox_header", id="port not a number"),
    pytest.param((b"sbx", b"agents", b"-1", "admin"), BadRequest, "invalid_sandbox_header", id="negative port"),
    pytest.param((b"../sbx", b"agents", None, "admin"), BadRequest, "invalid_sandbox_header", id="traversal"),
    pytest.param((b"Sbx", b"agents", None, "admin"), BadRequest, "invalid_sandbox_header", id="upper case"),
    pytest.param((b"sbx.svc.evil.example:80", b"agents", None, "admin"), BadRequest, "invalid_sandbox_header",
                 id="host name smuggling"),
    pytest.param((b"sbx", b"agents", None, "data"), Unauthorized, "unauthorized", id="a tenant's data-plane token"),
])
def test_router_headers_are_checked_token_first(keyfile, headers, error, code):
    compat = RouterCompat(["agents"], [8888], AdminTokens(KeySet.load(keyfile)), NoLocator())
    name, namespace, port, token = headers
    authorization = {None: None, "admin": bearer(keyfile), "data": bearer(keyfile, "sandbox-gateway")}[token]
    with pytest.raises(error) as info:
        compat.target(name, namespace, port, authorization.encode() if authorization else None)
    assert info.value.code == code


def test_a_valid_request_is_a_target(keyfile):
    compat = RouterCompat(["agents"], [8888, 9000], AdminTokens(KeySet.load(keyfile)), NoLocator())
    auth = bearer(keyfile).encode()
    assert compat.target(b"my-sandbox", b"agents", None, auth) == ("agents", "my-sandbox", 8888)
    assert compat.target(b"my-sandbox", b"agents", b"9000", auth) == ("agents", "my-sandbox", 9000)


def test_turning_it_on_needs_admin_keys():
    with pytest.raises(ValueError, match="needs --auth-keys"):
        Settings(router_compat_namespaces=["agents"])
    with pytest.raises(ValueError, match="not a Kubernetes namespace"):
        Settings(router_compat_namespaces=["Agents!"], auth_keys_file=Path("k.yaml"))


async def test_router_headers_on_a_real_serve(tmp_path, keyfile, make_fake_kube):
    """An admin reaches a Sandbox by name in an allowed namespace, at the pod IP its status reports."""
    kube = await make_fake_kube(namespaces=("agents", "other"), ready_delay=0)
    api = client.CustomObjectsApi(await kube.api_client())
    for namespace in ("agents", "other"):
        await api.create_namespaced_custom_object(SBX, "v1beta1", namespace, "sandboxes", sandbox("my-sandbox"))
    kube.controller.pod_ip_for = lambda ns, name: "127.0.0.1"
    async with aiohttp_backend(echo_headers) as pod:
        env = {"SANDBOX_GATEWAY_KUBECONFIG": str(kube.kubeconfig_path),
               "SANDBOX_GATEWAY_AUTH_KEYS_FILE": str(keyfile),
               "SANDBOX_GATEWAY_ROUTER_COMPAT_NAMESPACES": '["agents"]',
               "SANDBOX_GATEWAY_ROUTER_COMPAT_PORTS": f"[{pod.port}]",
               "SANDBOX_GATEWAY_ROUTER_COMPAT_API_VERSION": "v1beta1"}
        process = await GatewayProcess(tmp_path / "gw", env=env).start()
        try:
            assert any("router headers: namespaces agents" in line for line in process.log)
            async with aiohttp.ClientSession() as http:
                async def call(name: str, namespace: str = "agents", port: int = pod.port,
                               token: str | None = bearer(keyfile)) -> tuple[int, dict]:
                    headers = {"X-Sandbox-ID": name, "X-Sandbox-Namespace": namespace, "X-Sandbox-Port": str(port)}
                    if token:
                        headers["Authorization"] = token
                    async with http.get(f"{process.data_url}/x", headers=headers) as response:
                        return response.status, await response.json()

                status, seen = await call("my-sandbox")
                assert status == 200
                forwarded = {k.lower() for k in seen["headers"]}
                assert seen["headers"]["X-Sandbox-Id"] == "my-sandbox"
                assert not forwarded & {"authorization", "x-sandbox-namespace", "x-sandbox-port"}
                assert (await call("my-sandbox", token=None))[0] == 401
                assert (await call("my-sandbox", "other"))[1]["error"]["code"] == "namespace_not_allowed"
                assert (await call("my-sandbox", port=pod.port + 1))[1]["error"]["code"] == "port_not_allowed"
                status, body = await call("missing")
                assert (status, body["error"]["code"]) == (404, "sandbox_not_found")
                await api.create_namespaced_custom_object(SBX, "v1beta1", "agents", "sandboxes", sandbox("lost"))
                kube.controller.lose_pod("lost", "agents")
                status, body = await call("lost")
                assert (status, body["error"]["code"]) == (503, "sandbox_not_ready")
                listing = await (await http.get(f"{process.control_url}/v1/sandboxes",
                                                headers={"Authorization": bearer(keyfile)})).json()
                assert listing["sandboxes"] == []  # nothing of the gateway's own was created
        finally:
            await process.stop()


async def test_router_headers_are_dropped_when_off(tmp_path):
    """Off (the default): the headers neither route nor reach the sandbox; the identity routes."""
    process = await GatewayProcess(tmp_path / "gw").start()
    try:
        async with aiohttp.ClientSession() as http:
            headers = {"X-User-Id": "u", "X-Session-Id": "s", "X-Sandbox-ID": "other",
                       "X-Sandbox-Namespace": "kube-system", "X-Sandbox-Port": "22"}
            async with http.get(f"{process.data_url}/echo/x", headers=headers) as response:
                assert response.status == 200
                seen = await response.json()
        sent = {k.lower(): v for k, v in seen["headers"].items()}
        own = place(Identity.parse(user_id="u", session_id="s"), default_policy()).sandbox_id
        assert sent["x-sandbox-id"] == own
        assert "x-sandbox-namespace" not in sent and "x-sandbox-port" not in sent
    finally:
        await process.stop()
