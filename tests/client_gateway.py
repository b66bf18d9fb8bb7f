"""A whole gateway in-process for the client tests: app.py's wiring on free loopback ports, signing
keys (so it mints access tokens), preview URLs by host and by path, and local sandboxes running the
reference runtime unless a policy file says otherwise."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver

from gateway.app import Gateway
from gateway.auth import ADMIN_AUDIENCE, KeySet, issue_token
from gateway.settings import Settings
from tests.proxy_helpers import listening_socket

SECRET = "client-tests-secret-of-32-bytes-at-least"
PREVIEW_DOMAIN = "preview.localhost"
PATH_PREFIX = "/s"


@dataclass
class ClientGateway:
    gateway: Gateway
    admin: str           # an admin bearer token for the control API
    key_file: Path

    @property
    def data_url(self) -> str:
        host, port = self.gateway.data_address  # type: ignore[misc]
        return f"http://{host}:{port}"

    @property
    def control_url(self) -> str:
        host, port = self.gateway.control_address  # type: ignore[misc]
        return f"http://{host}:{port}"

    @property
    def data_port(self) -> int:
        return self.gateway.data_address[1]  # type: ignore[index]

    def owner(self, user: str = "alice", session: str | None = None, org: str | None = None) -> dict[str, str]:
        """Control-API headers of a caller: the admin token and the identity that owns sessions."""
        headers = {"Authorization": f"Bearer {self.admin}", "X-User-Id": user}
        if org is not None:
            headers["X-Org-Id"] = org
        if session is not None:
            headers["X-Session-Id"] = session
        return headers

    async def control(self, method: str, path: str, *, headers: dict[str, str], body: Any = None,
                      expect: int = 200) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, \
                http.request(method, self.control_url + path, headers=headers, json=body) as response:
            payload = await response.json()
            assert response.status == expect, payload
            return payload  # type: ignore[no-any-return]

    async def bind(self, user: str, session: str, org: str | None = None) -> dict[str, Any]:
        body = {"user_id": user, "session_id": session, **({"org_id": org} if org else {})}
        return await self.control("POST", "/v1/sessions", headers=self.owner(user), body=body)


class Loopback(AbstractResolver):
    """Every name is 127.0.0.1 (as a wildcard DNS record for the preview domain would make it)."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        return [{"hostname": host, "host": "127.0.0.1", "port": port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        pass


@contextlib.asynccontextmanager
async def client_gateway(tmp_path: Path, *, policy: str | None = None, **settings: Any) -> AsyncIterator[ClientGateway]:
    key_file = tmp_path / "keys.json"
    key_file.write_text(json.dumps({"keys": [{"kid": "k1", "alg": "HS256", "secret": SECRET}]}), encoding="utf-8")
    if policy is not None:
        (tmp_path / "policy.yaml").write_text(policy, encoding="utf-8")
        settings["policy_file"] = tmp_path / "policy.yaml"
    config = Settings(data_dir=tmp_path / "data", auth_keys_file=key_file, auth_mode="trusted-headers",
                      preview_domain=PREVIEW_DOMAIN, preview_path_prefix=PATH_PREFIX, drain_timeout=1.0,
                      upstream_connect_timeout=5.0, **settings)
    gateway = Gateway.create(config)
    await gateway.start(listening_socket(), listening_socket())
    admin = issue_token(KeySet.load(key_file).first(), user="ops", audience=ADMIN_AUDIENCE)
    try:
        yield ClientGateway(gateway, admin, key_file)
    finally:
        await gateway.stop()
