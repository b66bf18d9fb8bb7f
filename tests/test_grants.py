"""What an access grant lists (gateway/grants.py, pure): one URL per port the caller can open."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.access import AccessTokens
from gateway.auth import KeySet
from gateway.grants import AccessGrants
from gateway.model import Endpoint, Owner, SandboxRecord, SandboxState
from routing.ports import PortSet


@pytest.fixture
def grants(tmp_path: Path) -> AccessGrants:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {kid: k1, alg: HS256, secret: '" + "s" * 40 + "'}\n")
    return AccessGrants(AccessTokens(KeySet.load(keys), max_ttl=600), data_port=8080,
                        preview_domain="preview.example", path_prefix="/s")


RECORD = SandboxRecord("org-1", "small", "acme", SandboxState.READY, created_at=1.0,
                       endpoint=Endpoint("127.0.0.1", 19300), owner=Owner("acme", "u", None))


@pytest.mark.parametrize(("ports", "listed"), [
    pytest.param([19300, 19301], [19300, 19301], id="two adjacent ports: two URLs (was one {port} template)"),
    pytest.param([8888, 3000], [3000, 8888], id="two apart"),
    pytest.param(["3000-3015"], list(range(3000, 3016)), id="a range of 16: each port"),
    pytest.param(["3000-3999"], ["3000-3999"], id="a wide range: one template"),
])
def test_each_port_of_a_small_set_gets_its_own_urls(grants: AccessGrants, ports: list, listed: list) -> None:
    grant = grants.grant(RECORD, PortSet.parse(ports), request_host="gw.example:8081")
    assert [entry["port"] for entry in grant.urls] == listed
    for entry in grant.urls:
        shown = "{port}" if isinstance(entry["port"], str) else str(entry["port"])
        assert entry["path"].startswith(f"http://gw.example:8080/s/org-1/{shown}/?access_token=")
        assert entry["host"].startswith(f"http://{shown}-org-1.preview.example:8080/?access_token=")
