"""The pure parts of host and path keys: parsing, cookie cutting, response rewriting, pool ports."""

from __future__ import annotations

import pytest

from gateway.errors import BadRequest
from gateway.model import Endpoint
from gateway.policy import allowed_ports, parse_policy
from gateway.proxy._keys import PreviewKeys, query_token
from gateway.proxy._browser import rewrite_under_prefix
from gateway.proxy._wire import cut_access_cookie
from routing import PolicyError
from routing.ports import PortSet

ID = "usr-" + "0123456789abcdef" * 3
PREFIX = f"/s/{ID}/3000".encode()


@pytest.fixture(scope="module")
def keys() -> PreviewKeys:
    return PreviewKeys(None, domain="Preview.Example.com", path_prefix="/s/")  # type: ignore[arg-type]


@pytest.mark.parametrize("host, url, expected", [
    pytest.param(f"3000-{ID}.preview.example.com", "/a?b", (ID, 3000, None, "/a?b"), id="host"),
    pytest.param(f"3000-{ID}.PREVIEW.example.com:8080", "/", (ID, 3000, None, "/"), id="host with port, any case"),
    pytest.param("127.0.0.1:8080", f"/s/{ID}/3000/a/b?c=1", (ID, 3000, f"/s/{ID}/3000", "/a/b?c=1"), id="path"),
    pytest.param(None, f"/s/{ID}/3000?c=1", (ID, 3000, f"/s/{ID}/3000", None), id="path ending at the port"),
    pytest.param(None, f"/s/{ID}/3000", (ID, 3000, f"/s/{ID}/3000", None), id="bare path"),
    pytest.param("preview.example.com", "/x", None, id="the domain itself is no key"),
    pytest.param("evilpreview.example.com", "/x", None, id="a longer name is no key"),
    pytest.param("127.0.0.1", "/sx/a", None, id="outside the prefix"),
])
def test_keys_are_found(keys, host, url, expected):
    keyed = keys.match(host.encode() if host else None, url.encode())
    if expected is None:
        assert keyed is None
        return
    sandbox, port, prefix, rest = expected
    assert (keyed.sandbox_id, keyed.port) == (sandbox, port)
    assert keyed.prefix == (prefix.encode() if prefix else None)
    assert keyed.rest == (rest.encode() if rest is not None else None)


@pytest.mark.parametrize("host, url", [
    pytest.param(f"x-{ID}.preview.example.com", "/", id="port not a number"),
    pytest.param(f"70000-{ID}.preview.example.com", "/", id="port out of range"),
    pytest.param(f"0-{ID}.preview.example.com", "/", id="port zero"),
    pytest.param("3000-ses-abc.preview.example.com", "/", id="not a sandbox ID"),
    pytest.param(f"3000-{ID}.x.preview.example.com", "/", id="two labels"),
    pytest.param(None, "/s/../3000/", id="path traversal"),
    pytest.param(None, f"/s/{ID}/", id="no port"),
    pytest.param(None, f"/s/{ID}/30a0/", id="port with a letter"),
    pytest.param(None, f"/s/{ID.upper()}/3000/", id="upper-case ID"),
])
def test_malformed_keys_are_400(keys, host, url):
    with pytest.raises(BadRequest) as info:
        keys.match(host.encode() if host else None, url.encode())
    assert info.value.code in ("invalid_preview_host", "invalid_preview_path")


@pytest.mark.parametrize("value, kept, tokens", [
    pytest.param(b"a=1; sgw_access=t1; b=2", b"a=1; b=2", [b"t1"], id="middle"),
    pytest.param(b"sgw_access=t1", b"", [b"t1"], id="alone"),
    pytest.param(b"sgw_access=t1;sgw_access=t2; x=y", b"x=y", [b"t1", b"t2"], id="two"),
    pytest.param(b"my_sgw_access=t1; a=1", b"my_sgw_access=t1; a=1", [], id="another cookie's name"),
])
def test_access_cookie_is_cut(value, kept, tokens):
    assert cut_access_cookie(value) == (kept, tokens)


@pytest.mark.parametrize("url, token", [
    ("/a?access_token=abc&x=1", "abc"), ("/a?x=1&access_token=a%2Eb", "a.b"), ("/a?my_access_token=abc", None),
    ("/a", None),
])
def test_query_token(url, token):
    assert query_token(url.encode()) == token


@pytest.mark.parametrize("header, expected", [
    pytest.param("Location: /login", f"Location: {PREFIX.decode()}/login", id="path"),
    pytest.param("location: //cdn.example.com/x", "location: //cdn.example.com/x", id="scheme-relative untouched"),
    pytest.param("Location: next", "Location: next", id="relative untouched"),
    pytest.param("Location: http://10.0.0.5:3000/a?b", f"Location: {PREFIX.decode()}/a?b", id="the sandbox's host"),
    pytest.param("Location: https://GW.example.com/a", f"Location: {PREFIX.decode()}/a", id="the client's host"),
    pytest.param("Location: https://example.org/a", "Location: https://example.org/a", id="elsewhere untouched"),
    pytest.param("Set-Cookie: a=1; Path=/; HttpOnly", f"Set-Cookie: a=1; Path={PREFIX.decode()}/; HttpOnly", id="cookie"),
    pytest.param("set-cookie: a=1;path=/x", f"set-cookie: a=1; Path={PREFIX.decode()}/x", id="cookie, any case"),
    pytest.param("Set-Cookie: a=1; Domain=x", "Set-Cookie: a=1", id="cookie without a path, its Domain dropped"),
    pytest.param("X-Location: /login", "X-Location: /login", id="another header"),
])
def test_responses_are_rewritten_under_the_prefix(header, expected):
    head = b"HTTP/1.1 302 Found\r\n" + header.encode() + b"\r\nContent-Length: 0"
    out = rewrite_under_prefix(head, PREFIX, (b"10.0.0.5:3000", b"gw.example.com"))
    assert out == b"HTTP/1.1 302 Found\r\n" + expected.encode() + b"\r\nContent-Length: 0"


POLICY = """
pools:
  k: {provider: static, upstreams: ["http://10.0.0.1:8888"], ports: [8888, "3000-3999"]}
  plain: {provider: static, upstreams: ["http://10.0.0.2:8888"]}
routing: {prefix_pools: {default: k}}
"""


def test_pool_ports_on_the_providers_host():
    policy = parse_policy(POLICY, "p.yaml")
    assert allowed_ports(policy.pools["k"], Endpoint("10.0.0.1", 8888)) == PortSet.parse([8888, "3000-3999"])
    assert allowed_ports(policy.pools["plain"], Endpoint("10.0.0.2", 8888)) == PortSet.single(8888)
    unix = Endpoint(ID, 80, unix="/run/x.sock")
    assert allowed_ports(policy.pools["k"], unix) == PortSet.single(80)  # a Unix socket: its runtime port alone


@pytest.mark.parametrize("pool, message", [
    pytest.param('{provider: static, upstreams: ["http://h:1"], ports: ["22-"]}', "pools.a.ports", id="bad range"),
    pytest.param('{provider: static, upstreams: ["http://h:1"], ports: []}', "pools.a.ports", id="empty"),
    pytest.param("{provider: local, ports: [3000]}", "ports does not apply to provider 'local'", id="local"),
])
def test_bad_pool_ports_name_the_field(pool, message):
    with pytest.raises(PolicyError) as info:
        parse_policy(f"pools:\n  a: {pool}\nrouting: {{prefix_pools: {{default: a}}}}\n", "p.yaml")
    assert message in str(info.value) and "p.yaml" in str(info.value)
