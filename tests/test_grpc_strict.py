"""The gRPC front holds a client to RFC 9113 8.2-8.3 and to gRPC over HTTP/2, frame by frame.

A malformed request head (upper-case or duplicated names, unknown or misplaced pseudo-headers, fields
HTTP/2 forbids, a content-length the body does not match) is a stream error PROTOCOL_ERROR before any
call begins: nothing of it reaches the sandbox, whatever it spells. Identity and X-Sandbox-* fields in
capitals were forwarded by the old front (its filter compared lower-case names only): the table below
has each of them. Then: a non-gRPC request gets HTTP 415, PRIORITY's rules, a client's GOAWAY (which names
streams the *server* opened) leaves its calls to complete, a sandbox's RST_STREAM code reaches the client
as gRPC maps it, and grpc-timeout is passed on as sent.

Raw frames throughout (tests/test_grpc_hostile.py's client), since an HTTP/2 library will not send most
of these.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from h2.errors import ErrorCodes
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, PriorityFrame, RstStreamFrame

from gateway.grpcfront.head import encode_timeout_ms, grpc_content_type, timeout_left
from tests.grpc_helpers import grpc_gateway, static_policy
from tests.test_grpc_hostile import (IO, RawConnection, assert_connection_error, assert_stream_error, describe,
                                     frame_bytes, grpc_message, request_head)
from tests.test_grpc_hostile import conn, gateway, sandbox  # noqa: F401  # fixtures (an echo sandbox, a gateway)
from tests.test_grpc_sandbox_hostile import SandboxSide, fake_sandbox


def with_field(head: list[tuple[str, str]], field: tuple[str, str], *, at: int | None = None) -> list[tuple[str, str]]:
    head = list(head)
    head.insert(len(head) if at is None else at, field)
    return head


BASE = request_head("/test.Echo/Unary")
MALFORMED = {
    # what the old front forwarded to the sandbox, spelled in capitals (SECURITY.md guarantee 4)
    "Authorization in capitals": with_field(BASE, ("Authorization", "Bearer another-token")),
    "X-Sandbox-Id in capitals": with_field(BASE, ("X-Sandbox-Id", "ses-forged")),
    "X-Org-Id in capitals": with_field(BASE, ("X-Org-Id", "other-org")),
    "X-User-Id in capitals": with_field(BASE, ("X-User-Id", "someone-else")),
    "X-Forwarded-For in capitals": with_field(BASE, ("X-Forwarded-For", "10.0.0.1")),
    "Cookie in capitals": with_field(BASE, ("Cookie", "sgw_access=stolen")),
    "a name in mixed case": with_field(BASE, ("x-Custom", "1")),
    # pseudo-headers (8.3)
    "an unknown pseudo-header": with_field(BASE, (":foo", "bar"), at=1),
    ":status in a request": with_field(BASE, (":status", "200"), at=1),
    "a pseudo-header after a regular field": with_field(BASE, (":authority", "again")),
    "a duplicated :path": with_field(BASE, (":path", "/test.Echo/Meta"), at=1),
    "no :path": [field for field in BASE if field[0] != ":path"],
    "no :scheme": [field for field in BASE if field[0] != ":scheme"],
    # fields HTTP/2 forbids (8.2.2)
    "connection": with_field(BASE, ("connection", "keep-alive")),
    "transfer-encoding": with_field(BASE, ("transfer-encoding", "chunked")),
    "te other than trailers": [("te", "gzip") if field[0] == "te" else field for field in BASE],
    # field values (8.2.1)
    "a value with a leading space": with_field(BASE, ("x-custom", " padded")),
    "a value with a NUL": with_field(BASE, ("x-custom", "a\x00b")),
}


@pytest.mark.parametrize("head", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_request_head_is_a_stream_error_and_reaches_no_sandbox(conn, sandbox, gateway, head):
    service, _ = sandbox
    stream = conn.next_stream()
    await conn.send(HeadersFrame(stream, conn.encoder.encode(head), flags=["END_HEADERS"]),
                    DataFrame(stream, grpc_message(b"forged"), flags=["END_STREAM"]))
    await assert_stream_error(conn, stream, ErrorCodes.PROTOCOL_ERROR)  # and the connection then serves a call
    assert len(service.seen) == 1 and "authorization" not in service.seen[0]  # only assert_stream_error's call
    metrics = gateway.metrics.exposition()[0].decode()
    assert "sgw_grpc_malformed_requests_total 1.0" in metrics


@pytest.mark.parametrize(("declared", "sent"), [(10, 9), (3, 9), (9, 0)], ids=["short", "long", "none"])
async def test_a_content_length_the_body_does_not_match_is_a_stream_error(conn, sandbox, declared, sent):
    stream = conn.next_stream()
    head = with_field(BASE, ("content-length", str(declared)))
    if sent:
        await conn.send(HeadersFrame(stream, conn.encoder.encode(head), flags=["END_HEADERS"]),
                        DataFrame(stream, grpc_message(b"x" * (sent - 5)), flags=["END_STREAM"]))
    else:
        await conn.send(HeadersFrame(stream, conn.encoder.encode(head), flags=["END_HEADERS", "END_STREAM"]))
    await assert_stream_error(conn, stream, ErrorCodes.PROTOCOL_ERROR)


async def test_a_content_length_that_matches_is_served(conn):
    stream = conn.next_stream()
    body = grpc_message(b"exact")
    await conn.send(HeadersFrame(stream, conn.encoder.encode(with_field(BASE, ("content-length", str(len(body))))),
                                 flags=["END_HEADERS"]), DataFrame(stream, body, flags=["END_STREAM"]))
    end = await conn.finish(stream)
    assert isinstance(end, HeadersFrame) and conn.heads[stream][-1].get(b"grpc-status") == b"0", describe(end)


async def test_a_pseudo_header_in_the_trailers_is_a_stream_error(conn):
    stream = conn.next_stream()
    await conn.send(conn.head(stream, "/test.Echo/ClientStream"), DataFrame(stream, grpc_message(b"a")),
                    HeadersFrame(stream, conn.encoder.encode([(":path", "/x.Y/Z")]),
                                 flags=["END_HEADERS", "END_STREAM"]))
    await assert_stream_error(conn, stream, ErrorCodes.PROTOCOL_ERROR)


# -- content-type -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("content_type", ["application/grpcfoo", "application/json", None])
async def test_a_request_that_is_not_grpc_gets_http_415(conn, sandbox, content_type):
    head = [field for field in BASE if field[0] != "content-type"]
    if content_type is not None:
        head.append(("content-type", content_type))
    stream = conn.next_stream()
    await conn.send(HeadersFrame(stream, conn.encoder.encode(head), flags=["END_HEADERS"]),
                    DataFrame(stream, grpc_message(b"x"), flags=["END_STREAM"]))
    await conn.finish(stream)
    answer = conn.heads[stream][0]
    assert answer[b":status"] == b"415" and b"grpc-status" not in answer, answer
    assert b"unsupported_media_type" in conn.bodies[stream]
    assert sandbox[0].seen == []


def test_content_type_is_grpcs_own_not_a_prefix():
    assert [grpc_content_type(value) for value in (b"application/grpc", b"application/grpc+proto",
                                                   b"application/grpc;charset=utf-8")] == [True] * 3
    assert [grpc_content_type(value) for value in (b"application/grpcfoo", b"application/grp", b"text/plain",
                                                   b"", None)] == [False] * 5


@pytest.mark.parametrize("content_type", ["application/grpc+proto"])
async def test_grpc_content_types_with_a_codec_are_served(conn, content_type):
    head = [("content-type", content_type) if field[0] == "content-type" else field for field in BASE]
    stream = conn.next_stream()
    await conn.send(HeadersFrame(stream, conn.encoder.encode(head), flags=["END_HEADERS"]),
                    DataFrame(stream, grpc_message(b"x"), flags=["END_STREAM"]))
    await conn.finish(stream)
    assert conn.heads[stream][-1].get(b"grpc-status") == b"0", conn.heads[stream]


# -- PRIORITY ------------------------------------------------------------------------------------------------

async def test_priority_on_stream_0_is_a_connection_error(conn):
    await conn.send(frame_bytes(PriorityFrame.type, 0, b"\x00\x00\x00\x01\x10"))
    await assert_connection_error(conn, ErrorCodes.PROTOCOL_ERROR)


async def test_a_priority_frame_naming_its_own_stream_is_a_stream_error(conn):
    stream = conn.next_stream()
    await conn.send(PriorityFrame(stream, depends_on=stream, stream_weight=16))
    await assert_stream_error(conn, stream, ErrorCodes.PROTOCOL_ERROR)


async def test_headers_naming_their_own_stream_as_parent_are_a_stream_error(conn, sandbox):
    stream = conn.next_stream()
    await conn.send(HeadersFrame(stream, conn.encoder.encode(BASE), flags=["END_HEADERS", "PRIORITY"],
                                 depends_on=stream, stream_weight=16),
                    DataFrame(stream, grpc_message(b"x"), flags=["END_STREAM"]))
    await assert_stream_error(conn, stream, ErrorCodes.PROTOCOL_ERROR)  # the HPACK state stayed in step
    assert len(sandbox[0].seen) == 1


# -- a client's GOAWAY ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("last", [0, 1])
async def test_a_clients_goaway_lets_its_open_call_complete(conn, sandbox, last):
    """A client's last_stream_id names streams the server opened (RFC 9113 6.8): 0 is what a client sends,
    and its own calls are not cut by it."""
    stream = conn.next_stream()
    await conn.send(*conn.call(stream, message=b"after goaway"), GoAwayFrame(0, last_stream_id=last))
    end = await conn.finish(stream)
    assert isinstance(end, HeadersFrame), describe(end)
    assert conn.heads[stream][-1].get(b"grpc-status") == b"0" and conn.bodies[stream] == grpc_message(b"after goaway")


# -- a sandbox's reset, grpc-timeout ------------------------------------------------------------------------

async def reset_with(code: int, side: SandboxSide) -> None:
    await side.open()
    stream, _, _ = await side.request()
    await side.send(RstStreamFrame(stream, error_code=code))
    await side.until_closed()


@pytest.mark.parametrize(("code", "status"), [(ErrorCodes.INTERNAL_ERROR, b"13"), (ErrorCodes.PROTOCOL_ERROR, b"13"),
                                              (ErrorCodes.ENHANCE_YOUR_CALM, b"8")])
async def test_a_sandboxs_reset_reaches_the_client_as_grpc_maps_it(tmp_path, code, status):
    end, heads = await call_a_sandbox_that_resets(tmp_path, code)
    assert isinstance(end, HeadersFrame), describe(end)
    assert heads[-1][b"grpc-status"] == status and code.name.encode() in heads[-1][b"grpc-message"], heads


async def test_a_sandboxs_cancel_reaches_the_client_as_cancel(tmp_path):
    end, _ = await call_a_sandbox_that_resets(tmp_path, ErrorCodes.CANCEL)
    assert isinstance(end, RstStreamFrame) and end.error_code == ErrorCodes.CANCEL, describe(end)


async def call_a_sandbox_that_resets(tmp_path: Any, code: int) -> tuple[Any, list[dict[bytes, bytes]]]:
    """One unary call to a sandbox that resets it with ``code``: what ended it for the client, and its heads."""
    async def behaviour(side: SandboxSide) -> None:
        await reset_with(code, side)

    async with fake_sandbox(behaviour) as (_, port), \
            grpc_gateway(tmp_path, static_policy(tmp_path / "p.yaml", ["127.0.0.1"], port)) as gw:
        conn = await RawConnection.open(gw.grpc_address)
        try:
            stream = conn.next_stream()
            await conn.send(*conn.call(stream))
            return await conn.finish(stream), conn.heads.get(stream, [])
        finally:
            conn.close()


async def test_grpc_timeout_reaches_the_sandbox_as_sent(tmp_path):
    """Passed on as the client sent it (the old front re-encoded what was left, and 701m became 702m): five
    calls on a connection to the sandbox already open, where the gateway spends well under a millisecond;
    at least one must be exact (a loaded machine may take a millisecond on some), none longer."""
    heads: list[dict[bytes, bytes]] = []

    async def behaviour(side: SandboxSide) -> None:
        await side.open()
        while True:
            stream, head, body = await side.request()
            heads.append(head)
            await side.answer(stream, body[5:])

    async with fake_sandbox(behaviour) as (_, port), \
            grpc_gateway(tmp_path, static_policy(tmp_path / "p.yaml", ["127.0.0.1"], port)) as gw:
        conn = await RawConnection.open(gw.grpc_address)
        try:
            await conn.unary()  # the gateway's connection to the sandbox is opened by this one
            for _ in range(5):
                stream = conn.next_stream()
                head = with_field(BASE, ("grpc-timeout", "701m"))
                await conn.send(HeadersFrame(stream, conn.encoder.encode(head), flags=["END_HEADERS"]),
                                DataFrame(stream, grpc_message(b"t"), flags=["END_STREAM"]))
                await conn.finish(stream)
        finally:
            conn.close()
    sent = [head[b"grpc-timeout"] for head in heads[1:]]
    assert len(sent) == 5 and b"701m" in sent, sent
    assert all(value.endswith(b"m") and 600 < int(value[:-1]) <= 701 for value in sent), sent


def test_a_timeout_computed_from_a_deadline_does_not_gain_a_millisecond():
    now = 12345.678  # a loop's clock some hours in: the sum and difference lose the last bits
    assert encode_timeout_ms((now + 0.701) - now) == "701m"
    assert encode_timeout_ms(0.7004) == "701m"  # never shortened: what is left is rounded up
    assert encode_timeout_ms(0.0) == "1m"


def test_the_clients_timeout_is_passed_on_as_sent_until_a_millisecond_of_it_is_spent():
    """head.timeout_left: the client's own bytes (which the remembered sandbox head holds), else the time left."""
    sent = b"701m"
    assert timeout_left((sent, 0.701), 0.7005) is sent
    assert timeout_left((sent, 0.701), 0.6995) == b"700m"


# -- duplicated identity metadata, in lower case (well-formed HTTP/2, refused by the front) -------------------

@pytest.mark.parametrize("field", [("x-user-id", "someone-else"), ("authorization", "Bearer another-token"),
                                   ("x-session-id", "s2")])
async def test_identity_metadata_given_twice_is_invalid_argument_and_reaches_no_sandbox(conn, sandbox, field):
    head = with_field(BASE, field)
    if field[0] not in dict(BASE):
        head = with_field(head, (field[0], "Bearer the-first"))
    stream = conn.next_stream()
    await conn.send(HeadersFrame(stream, conn.encoder.encode(head), flags=["END_HEADERS"]),
                    DataFrame(stream, grpc_message(b"x"), flags=["END_STREAM"]))
    await conn.finish(stream)
    answer = conn.heads[stream][-1]
    assert answer[b"grpc-status"] == b"3" and b"given once" in answer[b"grpc-message"], answer
    assert sandbox[0].seen == []


async def test_x_sandbox_metadata_given_twice_is_dropped_and_the_gateways_own_sent(conn, sandbox):
    head = with_field(with_field(BASE, ("x-sandbox-id", "ses-forged")), ("x-sandbox-id", "ses-forged-2"))
    stream = conn.next_stream()
    await conn.send(HeadersFrame(stream, conn.encoder.encode(with_field(head, ("x-sandbox-port", "1"))),
                                 flags=["END_HEADERS"]), DataFrame(stream, grpc_message(b"x"), flags=["END_STREAM"]))
    await conn.finish(stream)
    [seen] = sandbox[0].seen
    assert seen["x-sandbox-id"] not in ("ses-forged", "ses-forged-2") and "x-sandbox-port" not in seen


# -- the access log for the front's own answers ------------------------------------------------------------

class Recorded:
    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.logged = asyncio.Event()

    def log(self, entry: Any) -> None:
        self.entries.append(entry)
        self.logged.set()


async def test_the_access_log_names_the_fronts_own_refusal(tmp_path):
    """A sandbox that cannot be reached: the line says why (error and code), not error=-."""
    with socket_port() as closed_port:
        async with grpc_gateway(tmp_path, static_policy(tmp_path / "p.yaml", ["127.0.0.1"], closed_port)) as gw:
            gw.grpc_front.access = recorded = Recorded()
            conn = await RawConnection.open(gw.grpc_address)
            try:
                stream = conn.next_stream()
                await conn.send(*conn.call(stream))
                await conn.finish(stream)
            finally:
                conn.close()
    [entry] = recorded.entries
    assert entry.status == 14 and entry.error == "upstream_unreachable" and entry.code == "upstream_unreachable"


async def test_the_access_log_has_the_sandboxs_time_to_answer(conn, gateway):
    gateway.grpc_front.access = recorded = Recorded()
    await conn.unary()
    await asyncio.wait_for(recorded.logged.wait(), IO)  # within ACCOUNT_WITHIN, with no call after it
    [entry] = recorded.entries
    assert entry.status == 0 and entry.upstream is not None and 0 < entry.upstream < IO and entry.error is None


async def test_a_calls_access_line_is_written_once_the_next_call_is_sent(conn, gateway):
    """The access line (and metrics) of a call that has ended wait for the next call's request to be on its way
    to the sandbox (GrpcFront.finished): off the path from a client's request to its answer."""
    front = gateway.grpc_front
    front.account()  # anything the fixture's calls left
    front.access = recorded = Recorded()
    await conn.unary()
    assert recorded.entries == [] and len(front.unaccounted) == 1  # its answer is written, its line not yet
    account = front.account
    seen: list[list[bool]] = []

    def accounted() -> None:  # what the calls in flight have sent the sandbox when the previous call is accounted
        seen.append([call.up is not None and call.up.local_closed for call in front.calls])
        account()

    front.account = accounted
    await conn.unary()
    assert seen[0] == [True] and [entry.status for entry in recorded.entries] == [0]


class socket_port:
    """A port on 127.0.0.1 nothing listens on (bound, not listening, for the test's length)."""

    def __enter__(self) -> int:
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


# -- TLS without ALPN h2 -------------------------------------------------------------------------------------

async def test_a_tls_client_offering_only_http_1_1_is_refused_in_http_1_1(sandbox, tmp_path):
    """RFC 9113 3.2: HTTP/2 over TLS is negotiated with ALPN h2. A client that offers only http/1.1 gets an
    answer it reads (505 with the JSON error) and the close, counted; one that offers h2 is served."""
    import ssl

    from tests.test_grpc_grpcio import _self_signed
    cert, key = _self_signed(tmp_path)
    policy = static_policy(tmp_path / "p.yaml", ["127.0.0.1"], sandbox[1])
    async with grpc_gateway(tmp_path, policy, grpc_tls_cert_file=cert, grpc_tls_key_file=key) as gw:
        answers = {}
        for offer in (["http/1.1"], ["h2"]):
            context = ssl.create_default_context(cafile=str(cert))
            context.set_alpn_protocols(offer)
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(*gw.grpc_address, ssl=context, server_hostname="127.0.0.1"), IO)
            if offer == ["h2"]:
                writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                answers["h2"] = await asyncio.wait_for(reader.read(9), IO)  # the front's SETTINGS
            else:
                writer.write(b"POST /test.Echo/Unary HTTP/1.1\r\nHost: x\r\n\r\n")
                answers["http/1.1"] = await asyncio.wait_for(reader.read(), IO)  # up to the close
            writer.close()
        metrics = gw.metrics.exposition()[0].decode()
    assert answers["http/1.1"].startswith(b"HTTP/1.1 505 ") and b'"http2_required"' in answers["http/1.1"]
    assert answers["h2"][3] == 4  # a SETTINGS frame: HTTP/2 spoken
    assert 'sgw_grpc_connection_errors_total{code="HTTP_1_1_REQUIRED",peer="client"} 1.0' in metrics


async def test_an_http_1_1_request_in_the_clear_gets_505_and_other_bytes_a_silent_close(sandbox, tmp_path):
    """curl on the gRPC port: a request line where the preface should be gets a 505 with the JSON error, which it
    reads, counted as HTTP_1_1_REQUIRED. Bytes that are neither (a TLS hello on the h2c port) get the close and
    not a frame: the front speaks only once a preface has arrived."""
    policy = static_policy(tmp_path / "p.yaml", ["127.0.0.1"], sandbox[1])
    async with grpc_gateway(tmp_path, policy) as gw:
        answers = {}
        for name, sent in (("http/1.1", b"GET /test.Echo/Unary HTTP/1.1\r\nHost: x\r\n\r\n"),
                           ("tls", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")):
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*gw.grpc_address), IO)
            writer.write(sent)
            answers[name] = await asyncio.wait_for(reader.read(), IO)  # up to the close
            writer.close()
        metrics = gw.metrics.exposition()[0].decode()
    assert answers["http/1.1"].startswith(b"HTTP/1.1 505 ") and b'"http2_required"' in answers["http/1.1"]
    assert b"HTTP/1.1 goes to the data plane" in answers["http/1.1"]
    assert answers["tls"] == b""
    assert 'sgw_grpc_connection_errors_total{code="HTTP_1_1_REQUIRED",peer="client"} 1.0' in metrics


async def test_a_malformed_head_repeated_on_a_connection_is_refused_each_time(conn, sandbox):
    """The second time, its header block is indexed fields only, and its check is remembered with it
    (headers.HeaderCodec.check_request): remembered as malformed, not skipped."""
    head = MALFORMED["Authorization in capitals"]
    for _ in range(3):
        stream = conn.next_stream()
        await conn.send(HeadersFrame(stream, conn.encoder.encode(head), flags=["END_HEADERS"]),
                        DataFrame(stream, grpc_message(b"forged"), flags=["END_STREAM"]))
        end = await conn.ending(stream)
        assert isinstance(end, RstStreamFrame) and end.error_code == ErrorCodes.PROTOCOL_ERROR, describe(end)
    for _ in range(2):
        await conn.unary()  # a well-formed head, twice: served (remembered as well-formed)
    assert len(sandbox[0].seen) == 2 and all("authorization" not in seen for seen in sandbox[0].seen)


# -- one set of header rules (gateway/proxy/_admission.py) ---------------------------------------------------

async def test_grpc_metadata_follows_the_data_planes_header_rules(conn, sandbox):
    """What the HTTP data plane never forwards, the gRPC front does not either: X-Forwarded-* (the gateway's
    to set), Forwarded, the access-token cookie (the rest of Cookie goes on), the router's X-Sandbox-*."""
    from gateway.access import COOKIE_NAME
    extra = [("x-forwarded-for", "10.9.9.9"), ("forwarded", "for=10.9.9.9"), ("x-forwarded-host", "evil"),
             ("cookie", f"{COOKIE_NAME}=secret-token; theme=dark"), ("x-sandbox-namespace", "other"),
             ("x_org_id", "other-org"), ("x-request-id", "req-1"), ("x-custom", "kept")]
    head = list(BASE)
    for field in extra:
        head = with_field(head, field)
    stream = conn.next_stream()
    await conn.send(HeadersFrame(stream, conn.encoder.encode(head), flags=["END_HEADERS"]),
                    DataFrame(stream, grpc_message(b"x"), flags=["END_STREAM"]))
    end = await conn.finish(stream)
    assert conn.heads[stream][-1].get(b"grpc-status") == b"0", describe(end)
    [seen] = sandbox[0].seen
    assert {key: seen.get(key) for key in ("cookie", "x-request-id", "x-custom")} == {
        "cookie": "theme=dark", "x-request-id": "req-1", "x-custom": "kept"}
    assert not {"x-forwarded-for", "forwarded", "x-forwarded-host", "x-sandbox-namespace", "x_org_id"} & set(seen)


async def test_the_startup_log_says_https_when_the_front_speaks_tls(tmp_path):
    from tests.gateway_process import GatewayProcess
    from tests.test_grpc_grpcio import _self_signed
    cert, key = _self_signed(tmp_path)
    process = await GatewayProcess(tmp_path / "gw", env={"SANDBOX_GATEWAY_GRPC_TLS_CERT_FILE": str(cert),
                                                         "SANDBOX_GATEWAY_GRPC_TLS_KEY_FILE": str(key)}).start()
    try:
        [line] = [line for line in process.log if "gRPC front (worker" in line]
        assert "https://" in line and "h2c://" not in line, line
    finally:
        await process.stop()
