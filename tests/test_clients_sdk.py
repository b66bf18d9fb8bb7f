"""The agent-sandbox Python SDK (``k8s-agent-sandbox``) through the gateway to local sandboxes
running the reference runtime: commands and file operations, in direct mode (the caller's identity
in ``extra_headers``) and in its native router mode with a sandbox access token (no admin token).

The SDK is synchronous (requests): it runs in a thread against the gateway on this loop. It reads
the Sandbox object from Kubernetes only to learn a pod IP (``X-Sandbox-Pod-IP``); ``NoCluster``
answers that read with a forged IP, which the gateway must neither use nor forward.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from k8s_agent_sandbox.exceptions import SandboxRequestError
from k8s_agent_sandbox.k8s_helper import K8sHelper
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from k8s_agent_sandbox.sandbox import Sandbox
from kubernetes.client import ApiClient

from tests.client_gateway import ClientGateway, client_gateway

FORGED_POD_IP = "10.9.9.9"


class NoCluster(K8sHelper):
    """A hand-written stand-in for the cluster the SDK would ask for the pod IP."""

    def __init__(self) -> None:
        super().__init__(api_client=ApiClient())  # given a client, the helper loads no kubeconfig
        self.reads = 0

    def get_sandbox(self, name: str, namespace: str) -> dict[str, Any] | None:
        self.reads += 1
        return {"metadata": {"name": name}, "status": {"podIPs": [{"ip": FORGED_POD_IP}]}}


@pytest.fixture
async def gw(tmp_path):
    async with client_gateway(tmp_path) as gateway:
        yield gateway


def sdk_sandbox(gw: ClientGateway, sandbox_id: str, port: int, headers: dict[str, str]) -> Sandbox:
    config = SandboxDirectConnectionConfig(api_url=gw.data_url, server_port=port, extra_headers=headers)
    return Sandbox(claim_name="claim", sandbox_id=sandbox_id, namespace="default", connection_config=config,
                   k8s_helper=NoCluster())


def exercise(sandbox: Sandbox) -> dict[str, Any]:
    """What an agent does with a sandbox: run commands, write, list and read files (blocking: SDK)."""
    try:
        sandbox.files.write("notes/hello.txt", b"hello from the SDK\n")
        ran = sandbox.commands.run("cat notes/hello.txt && echo oops >&2 && exit 3")
        listed = sorted(entry.name for entry in sandbox.files.list("notes"))
        seen = sandbox.connector.send_request("GET", "echo/probe").json()  # what reached the sandbox
        return {"stdout": ran.stdout, "stderr": ran.stderr, "exit_code": ran.exit_code, "listed": listed,
                "read": sandbox.files.read("notes/hello.txt"), "exists": sandbox.files.exists("notes/hello.txt"),
                "missing": sandbox.files.exists("notes/nope.txt"), "seen": seen,
                "pod_ip_offered": sandbox.k8s_helper.reads > 0}
    finally:
        sandbox.close_connection()


def assert_worked(result: dict[str, Any], sandbox_id: str) -> None:
    assert (result["stdout"], result["stderr"], result["exit_code"]) == ("hello from the SDK\n", "oops\n", 3)
    assert result["listed"] == ["hello.txt"] and result["read"] == b"hello from the SDK\n"
    assert (result["exists"], result["missing"]) == (True, False)
    assert result["pod_ip_offered"]  # the SDK did send its X-Sandbox-Pod-IP ...
    headers = {name.lower(): value for name, value in result["seen"]["headers"].items()}
    assert headers["x-sandbox-id"] == sandbox_id  # the gateway's, whatever the SDK said
    forwarded = [name for name in headers if name.startswith("x-sandbox-") and name != "x-sandbox-id"]
    assert forwarded == [] and FORGED_POD_IP not in str(headers)  # ... dropped, with -Port/-Timeout/-Namespace
    assert "authorization" not in headers and "x-user-id" not in headers and "x-session-id" not in headers


async def test_direct_mode_with_identity_headers(gw):
    bound = await gw.bind("alice", "sdk-1")
    # direct mode routes by identity: the SDK's own X-Sandbox-ID (here a name it made up) is ignored
    sandbox = sdk_sandbox(gw, "made-up-claim-name", 8888, {"X-User-Id": "alice", "X-Session-Id": "sdk-1"})
    result = await asyncio.to_thread(exercise, sandbox)
    assert_worked(result, bound["sandbox_id"])


async def test_router_mode_with_an_access_token_and_no_admin_token(gw):
    await gw.bind("alice", "sdk-2")
    grant = await gw.control("POST", "/v1/sessions/sdk-2/access", headers=gw.owner("alice"))
    port = grant["ports"][0]
    sandbox = sdk_sandbox(gw, grant["sandbox_id"], port, grant["headers"])  # Authorization: Bearer <access token>
    result = await asyncio.to_thread(exercise, sandbox)
    assert_worked(result, grant["sandbox_id"])


async def test_router_mode_token_opens_its_sandbox_only(gw):
    await gw.bind("alice", "sdk-3")
    other = await gw.bind("bob", "sdk-4")
    grant = await gw.control("POST", "/v1/sessions/sdk-3/access", headers=gw.owner("alice"))
    sandbox = sdk_sandbox(gw, other["sandbox_id"], grant["ports"][0], grant["headers"])

    def run() -> SandboxRequestError:
        try:
            with pytest.raises(SandboxRequestError) as refused:
                sandbox.commands.run("true")
            return refused.value
        finally:
            sandbox.close_connection()

    refused = await asyncio.to_thread(run)
    assert refused.status_code == 403
    assert refused.response.json()["error"]["code"] == "access_token_wrong_sandbox"
