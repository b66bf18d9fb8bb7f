"""Log output: the hand-formatted access log (its line shape, what the data plane records for it, and
its order among the other log lines)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re

import pytest
from aiohttp import web

from gateway.logs import AccessLog, FlushingHandler, JsonFormatter
from gateway.proxy import RequestLog
from tests.proxy_helpers import CachingFakeResolver, StartGateway, backend, eventually, start_gateway  # noqa: F401 (fixture)


def entry(**fields: object) -> RequestLog:
    values: dict[str, object] = dict(method="GET", pool="small", sandbox_id="ses-abc", status=200,
                                     duration=0.0012345, bytes_in=3, bytes_out=5, protocol="http",
                                     request_id="rid-1", error=None, org_id="acme", refused=None,
                                     target="/v1/run?access_token=secret", session_id="s-1", upstream=0.0008, code=None)
    values.update(fields)
    return RequestLog(**values)  # type: ignore[arg-type]


def json_lines(access: AccessLog, out: io.StringIO, *entries: RequestLog) -> list[dict[str, object]]:
    for item in entries:
        access.log(item)
    access.flush()
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_access_log_json_lines_parse_and_batch():
    """The access log formats its JSON by hand (no LogRecord): every line must still be valid JSON,
    with a pool name that needs escaping and absent fields as null; nothing is written before flush."""
    out = io.StringIO()
    access = AccessLog(out, json_lines=True)
    access.log(entry(pool='po"ol\\\n', protocol="sse"))
    access.log(entry(method="POST", pool=None, sandbox_id=None, status=400, org_id=None, session_id=None,
                     upstream=None, code="bad_request"))
    assert out.getvalue() == ""
    access.flush()
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["pool"] == 'po"ol\\\n' and first["sandbox_id"] == "ses-abc" and first["duration_ms"] == 1.23
    assert first["protocol"] == "sse" and first["logger"] == "gateway.access"
    assert second["pool"] is None and second["sandbox_id"] is None and second["status"] == 400
    assert second["upstream_ms"] is None and second["error"] == "bad_request"


def test_access_log_json_has_the_nginx_envoy_fields():
    out = io.StringIO()
    (line,) = json_lines(AccessLog(out, json_lines=True), out, entry())
    assert line["msg"] == "GET /v1/run 200"
    assert {key: line[key] for key in ("method", "path", "status", "bytes_in", "bytes_out", "duration_ms",
                                        "upstream_ms", "request_id", "session_id", "org_id", "sandbox_id", "pool",
                                        "protocol", "error")} == {
        "method": "GET", "path": "/v1/run", "status": 200, "bytes_in": 3, "bytes_out": 5, "duration_ms": 1.23,
        "upstream_ms": 0.8, "request_id": "rid-1", "session_id": "s-1", "org_id": "acme", "sandbox_id": "ses-abc",
        "pool": "small", "protocol": "http", "error": None}
    assert "secret" not in out.getvalue(), "the query string (it may carry a token) is dropped by default"


@pytest.mark.parametrize("json_mode", [True, False], ids=["json", "text"])
def test_access_log_keeps_the_query_when_configured(json_mode: bool):
    out = io.StringIO()
    access = AccessLog(out, json_lines=json_mode, keep_query=True)
    access.log(entry())
    access.flush()
    assert "/v1/run?access_token=secret" in out.getvalue()


@pytest.mark.parametrize("session,path", [
    pytest.param('s"1\\', '/a"b', id="quotes and backslashes"),
    pytest.param("sé ssion", "/caf\u00e9", id="non-ASCII and space"),
    pytest.param("", "/", id="empty session"),
])
def test_access_log_escapes_caller_chosen_fields(session: str, path: str):
    """Session, org and path are chosen by callers: a JSON line stays one valid object, a text line one
    line with each value as one token."""
    out = io.StringIO()
    (line,) = json_lines(AccessLog(out, json_lines=True), out, entry(session_id=session, org_id=session, target=path))
    assert line["session_id"] == session and line["org_id"] == session and line["path"] == path
    assert line["msg"] == f"GET {path} 200"
    text = io.StringIO()
    access = AccessLog(text, json_lines=False)
    access.log(entry(session_id=session, target=path))
    access.flush()
    value = re.search(r" session_id=(\S+|\"(?:[^\"\\]|\\.)*\") org_id=", text.getvalue()).group(1)  # type: ignore[union-attr]
    assert (json.loads(value) if value.startswith('"') else value) == session
    assert text.getvalue().count("\n") == 1


@pytest.mark.parametrize("json_mode", [True, False], ids=["json", "text"])
def test_access_log_fields_kept_between_lines_follow_every_change(json_mode: bool):
    """The access log keeps each target's method, path and status fields and each session's org, sandbox
    and pool fields from line to line: a line that changes any one of them (same target, same session)
    shows its own values, and going back shows the first ones again."""
    changes = [{}, {"method": "POST"}, {"status": 404}, {"sandbox_id": "ses-other"}, {"org_id": None},
               {"pool": "large"}, {"session_id": None}, {}]
    out = io.StringIO()
    access = AccessLog(out, json_lines=json_mode)
    for change in changes:
        access.log(entry(**change))
    access.flush()
    lines = out.getvalue().splitlines()
    assert len(lines) == len(changes)
    for change, line in zip(changes, lines):
        want = {"method": "GET", "status": 200, "sandbox_id": "ses-abc", "org_id": "acme", "pool": "small",
                "session_id": "s-1", **change}
        if json_mode:
            got = json.loads(line)
            assert {name: got[name] for name in want} == want
            assert got["msg"] == f"{want['method']} /v1/run {want['status']}"
        else:
            assert f" {want['method']} /v1/run {want['status']} " in line
            for name in ("sandbox_id", "org_id", "pool", "session_id"):
                assert f" {name}={want[name] or '-'} " in line


def test_access_log_text_line_shape():
    out = io.StringIO()
    access = AccessLog(out, json_lines=False)
    access.log(entry())
    access.log(entry(method="-", target="-", status=400, pool=None, sandbox_id=None, session_id=None, org_id=None,
                     upstream=None, code="bad_request", bytes_in=0, bytes_out=0))
    access.flush()
    ok, bad = out.getvalue().splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO    gateway\.access: GET /v1/run 200 bytes_in=3 "
                        r"bytes_out=5 duration_ms=1\.23 upstream_ms=0\.80 request_id=rid-1 session_id=s-1 org_id=acme "
                        r"sandbox_id=ses-abc pool=small protocol=http error=-", ok), ok
    assert "gateway.access: - - 400 " in bad and bad.endswith(" pool=- protocol=http error=bad_request")


def test_other_log_lines_flush_pending_access_lines_first():
    """Access lines are batched; a line from any other logger writes the batch first, so the log reads
    in the order things happened."""
    out = io.StringIO()
    access = AccessLog(out, json_lines=True)
    handler = FlushingHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.access = access
    logger = logging.getLogger("test.order")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        access.log(entry(request_id="before"))
        logger.warning("something happened")
        access.log(entry(request_id="after"))
        access.flush()
    finally:
        logger.removeHandler(handler)
    order = [line.get("request_id") or line["msg"] for line in map(json.loads, out.getvalue().splitlines())]
    assert order == ["before", "something happened", "after"]


async def test_the_data_plane_records_what_the_access_log_needs(start_gateway: StartGateway, aiohttp_server):
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, ok)))
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"GET /a/b?x=1 HTTP/1.1\r\nHost: h\r\nX-User-Id: u1\r\nX-Session-Id: s-9\r\nX-Org-Id: acme\r\n\r\n")
    await reader.readuntil(b"hello")
    writer.write(b"GET /c HTTP/1.1\r\nHost: h\r\nX-Session-Id: s-9\r\n\r\n")  # no X-User-Id: the gateway answers
    await reader.readuntil(b"}}")
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"\x00\x01 not http\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 400")
    writer.close()
    await eventually(lambda: len(gw.records) == 3)
    proxied, refused, malformed = gw.records
    assert (proxied.method, proxied.target, proxied.session_id, proxied.org_id, proxied.code) == (
        "GET", "/a/b?x=1", "s-9", "acme", None)
    assert proxied.upstream is not None and 0 < proxied.upstream <= proxied.duration
    assert (refused.status, refused.code, refused.upstream, refused.target) == (400, "invalid_identity", None, "/c")
    assert (malformed.method, malformed.target, malformed.status, malformed.code) == ("-", "-", 400, "bad_request")


def test_a_finished_exchanges_record_has_every_field_the_constructor_would_give():
    """``request_log`` fills the record field by field (no constructor call on the hot path): the same record
    as ``RequestLog(...)`` with the exchange's values, and ``-``/None where a request had no method, target,
    request ID, route, identity or trace."""
    from types import SimpleNamespace

    from gateway.model import Endpoint, Owner, Route
    from gateway.proxy._exchange import Exchange, request_log
    from routing import Identity

    identity = Identity("u1", "s-9", "acme")
    ex = Exchange(None)  # type: ignore[arg-type]
    ex.method, ex.url, ex.request_id, ex.status, ex.bytes_in, ex.bytes_out = b"PUT", b"/a?b=1", b"r-1", 201, 7, 9
    ex.protocol, ex.error, ex.refused, ex.upstream_time, ex.code = "sse", "upstream_closed", "org_streams", 0.25, "x"
    ex.identity, ex.route = identity, Route("s-9", "ses-1", "small", Endpoint("h", 1), Owner.of(identity))
    ex.trace = SimpleNamespace(trace_id="0af7")
    want = RequestLog("PUT", "small", "ses-1", 201, 1.5, 7, 9, "sse", "r-1", "upstream_closed", "acme", "org_streams",
                      "/a?b=1", "s-9", 0.25, "x", "0af7")
    assert repr(request_log(ex, 1.5)) == repr(want)
    bare = request_log(Exchange(None), 0.0)  # type: ignore[arg-type]
    assert repr(bare) == repr(RequestLog("-", None, None, 0, 0.0, 0, 0, "http", "", None))


async def test_an_upstream_failure_is_logged_with_its_code(start_gateway: StartGateway):
    from gateway.model import Endpoint
    from tests.proxy_helpers import dead_port

    gw = await start_gateway(CachingFakeResolver(Endpoint("127.0.0.1", dead_port())), upstream_connect_retries=0)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: h\r\nX-User-Id: u1\r\nX-Session-Id: s1\r\n\r\n")
    assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 502")
    writer.close()
    await eventually(lambda: len(gw.records) == 1)
    assert gw.records[0].code == "upstream_unreachable" and gw.records[0].error == "upstream_unreachable"
