"""The gRPC front against a real grpclib sandbox, with grpclib's client: every call kind, byte for byte.

Each scenario runs direct to the sandbox and through the gateway; the answers
(messages, initial metadata, trailers, status) must be the same bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
from typing import Any

import h2.connection
import h2.events
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from h2.config import H2Configuration

from gateway.policy import load_policy
from routing.ids import per_session_sandbox_id
from tests.proxy_helpers import dead_port
from tests.grpc_helpers import (BIDI, CLIENT_STREAM, SERVER_STREAM, STRIPPED, UNARY, RawCodec, echo_server, grpc_gateway,
                                ident, static_policy)


@pytest.fixture
async def sandbox():
    async with echo_server() as (service, port):
        yield service, port


@pytest.fixture
async def gateway(sandbox, tmp_path):
    _, port = sandbox
    async with grpc_gateway(tmp_path, static_policy(tmp_path / "policy.yaml", ["127.0.0.1"], port)) as gw:
        yield gw


@pytest.fixture
async def channels(sandbox, gateway):
    """(direct, through the gateway)"""
    direct = Channel("127.0.0.1", sandbox[1], codec=RawCodec())
    front = Channel(*gateway.grpc_address, codec=RawCodec())
    yield direct, front
    direct.close()
    front.close()


def _metadata(md: Any) -> list[tuple[str, Any]]:
    return sorted((k, v) for k, v in (md or {}).items() if k not in ("date", "user-agent"))


async def run_call(channel: Channel, path: str, cardinality: Any, messages: list[bytes], *,
                   metadata: dict[str, str] | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Everything the client observes of one call."""
    async with channel.request(path, cardinality, bytes, bytes, metadata=metadata or ident(),
                               timeout=timeout) as stream:
        for message in messages:
            await stream.send_message(message)
        await stream.end()
        received: list[bytes] = []
        try:
            async for m in stream:
                received.append(m)
            await stream.recv_trailing_metadata()
            status, message = Status.OK, None
        except GRPCError as exc:
            status, message = exc.status, exc.message
        return {"messages": received, "initial": _metadata(stream.initial_metadata),
                "trailing": _metadata(stream.trailing_metadata), "status": status, "message": message}


CASES = [
    pytest.param("/test.Echo/Unary", UNARY, [b"\x00\x01hello\xff"], id="unary"),
    pytest.param("/test.Echo/Unary", UNARY, [b""], id="unary empty message"),
    pytest.param("/test.Echo/ClientStream", CLIENT_STREAM, [b"a", b"", b"c" * 100_000], id="client streaming"),
    pytest.param("/test.Echo/ServerStream", SERVER_STREAM, [b"20:1000"], id="server streaming"),
    pytest.param("/test.Echo/Bidi", BIDI, [b"one", b"two", bytes(range(256)) * 300], id="bidi"),
    pytest.param("/test.Echo/Fail", UNARY, [b"x"], id="sandbox error status"),
]


@pytest.mark.parametrize(("path", "cardinality", "messages"), CASES)
async def test_byte_exact_against_direct(channels, path, cardinality, messages):
    direct, front = channels
    expected = await run_call(direct, path, cardinality, messages)
    assert await run_call(front, path, cardinality, messages) == expected


async def test_server_stream_of_10000_messages(channels):
    direct, front = channels
    expected = await run_call(direct, "/test.Echo/ServerStream", SERVER_STREAM, [b"10000:64"])
    got = await run_call(front, "/test.Echo/ServerStream", SERVER_STREAM, [b"10000:64"])
    assert len(got["messages"]) == 10_000 and got == expected


async def test_a_16_mb_message_both_ways(channels):
    direct, front = channels
    big = bytes(range(256)) * (16 * 1024 * 1024 // 256)
    got = await run_call(front, "/test.Echo/Bidi", BIDI, [big])
    assert got["status"] is Status.OK and got["messages"] == [big[::-1]]
    assert got == await run_call(direct, "/test.Echo/Bidi", BIDI, [big])


async def test_metadata_and_trailers_both_ways(channels, sandbox):
    service, _ = sandbox
    direct, front = channels
    request = [json.dumps({"status": Status.NOT_FOUND.value, "message": "nothing here: ü"}).encode()]
    sent = ident(**{"x-custom": "v1", "x-blob-bin": b"\x00\x01", "x-sandbox-id": "forged", "x-sandbox-port": "1",
                    "x-org-id": "o1", "authorization": "Bearer nope"})
    got = await run_call(front, "/test.Echo/Meta", UNARY, request, metadata=sent)
    assert got["status"] is Status.NOT_FOUND and got["message"] == "nothing here: ü"
    assert ("x-initial", "one") in got["initial"] and ("x-blob-bin", b"\x00\xffinit") in got["initial"]
    assert ("x-trailer", "two") in got["trailing"] and ("x-trail-bin", b"\x01\x02") in got["trailing"]
    seen = service.seen[-1]
    assert seen["x-custom"] == "v1"
    assert not STRIPPED & set(seen) and "x-sandbox-port" not in seen
    assert seen["x-sandbox-id"] == per_session_sandbox_id("s1")
    # Direct, the answer is the same (the sandbox's body echoes what it received, which differs by design).
    plain = await run_call(direct, "/test.Echo/Meta", UNARY, request, metadata=sent)
    assert {k: v for k, v in got.items() if k != "messages"} == {k: v for k, v in plain.items() if k != "messages"}


async def test_client_cancellation_reaches_the_sandbox(channels, sandbox):
    service, _ = sandbox
    _, front = channels
    async with front.request("/test.Echo/Slow", UNARY, bytes, bytes, metadata=ident()) as stream:
        await stream.send_message(b"x", end=True)
        await asyncio.wait_for(service.slow_started.wait(), 10)
        await stream.cancel()
    await asyncio.wait_for(service.cancelled.wait(), 10)


async def test_a_100ms_deadline_ends_the_call_and_cancels_the_sandbox(channels, sandbox):
    """Both ends time the deadline: grpclib's client reports its own as TimeoutError, the gateway's
    (which can reach the client first) is DEADLINE_EXCEEDED (grpcio's view is in test_grpc_grpcio)."""
    service, _ = sandbox
    _, front = channels
    try:
        got = await run_call(front, "/test.Echo/Slow", UNARY, [b"x"], timeout=0.1)
    except asyncio.TimeoutError:
        pass
    else:
        assert got["status"] is Status.DEADLINE_EXCEEDED and got["messages"] == []
    await asyncio.wait_for(service.cancelled.wait(), 10)


async def test_the_deadline_is_propagated_to_the_sandbox(channels, sandbox):
    service, _ = sandbox
    _, front = channels
    got = await run_call(front, "/test.Echo/Meta", UNARY, [b"{}"], timeout=5)
    assert json.loads(got["messages"][0])["deadline"] is True
    got = await run_call(front, "/test.Echo/Meta", UNARY, [b"{}"])
    assert json.loads(got["messages"][0])["deadline"] is False


async def test_no_identity_is_unauthenticated(channels):
    _, front = channels
    got = await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata={"x-custom": "1"})
    assert got["status"] is Status.UNAUTHENTICATED and "x-user-id" in got["message"]


async def test_a_partial_identity_is_invalid_argument_naming_the_key(channels):
    _, front = channels
    got = await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata={"x-user-id": "u1"})
    assert got["status"] is Status.INVALID_ARGUMENT and "X-Session-Id" in got["message"]


async def test_a_session_is_refused_to_another_user_on_the_connection_its_owner_used(channels):
    """A connection remembers its last route for its identity (the owner check is not asked again for it): a call
    with another identity on that connection, for the same session, is still checked, and refused as a session
    that does not exist; the owner's next call is served."""
    _, front = channels
    for _ in range(2):
        got = await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata=ident("s1", "u1"))
        assert got["status"] is Status.OK and got["messages"] == [b"x"]
    got = await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata=ident("s1", "u2"))
    assert got["status"] is Status.NOT_FOUND and got["messages"] == []
    got = await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata=ident("s1", "u1"))
    assert got["status"] is Status.OK and got["messages"] == [b"x"]


async def test_sandbox_down_is_unavailable(tmp_path):
    port = dead_port()
    async with grpc_gateway(tmp_path, static_policy(tmp_path / "p.yaml", ["127.0.0.1"], port)) as gw:
        channel = Channel(*gw.grpc_address, codec=RawCodec())
        try:
            got = await run_call(channel, "/test.Echo/Unary", UNARY, [b"x"])
        finally:
            channel.close()
    assert got["status"] is Status.UNAVAILABLE and "upstream_unreachable" in got["message"]


async def test_a_reloaded_policy_moves_calls_to_the_pools_new_grpc_port(tmp_path):
    """The front remembers each route's target (GrpcFront.target) until the policy is replaced: a pool whose
    grpc_port moved is reached at the new port from the next call on, on the same client connection."""
    async with echo_server(name="old") as (_, old_port), echo_server(name="new") as (_, new_port):
        policy = static_policy(tmp_path / "p.yaml", ["127.0.0.1"], old_port)
        async with grpc_gateway(tmp_path, policy) as gw:
            channel = Channel(*gw.grpc_address, codec=RawCodec())
            try:
                async def answered_by() -> str:
                    got = await run_call(channel, "/test.Echo/Meta", UNARY, [b"{}"])
                    return json.loads(got["messages"][0])["sandbox"]

                assert [await answered_by(), await answered_by()] == ["old", "old"]  # the second from the memo
                static_policy(policy, ["127.0.0.1"], new_port)
                gw.router.view.replace(load_policy(gw.settings))
                assert await answered_by() == "new"
            finally:
                channel.close()


async def test_another_owner_gets_not_found(channels):
    _, front = channels
    assert (await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata=ident("s9", "alice")))["status"] is Status.OK
    got = await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata=ident("s9", "mallory"))
    assert got["status"] is Status.NOT_FOUND


async def test_a_repeated_head_is_admitted_as_the_first(channels):
    """Request heads are remembered per connection (Call._admit): sent again on the same connection, a
    head is read as the first time, an identity never taken for another's, a refused head refused again."""
    _, front = channels
    for _ in range(3):
        alice = await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata=ident("s8", "alice"))
        mallory = await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata=ident("s8", "mallory"))
        nobody = await run_call(front, "/test.Echo/Unary", UNARY, [b"x"], metadata={"x-custom": "1"})
        assert (alice["status"], mallory["status"], nobody["status"]) == (Status.OK, Status.NOT_FOUND,
                                                                          Status.UNAUTHENTICATED)


async def _sandboxes_on_two_hosts(stack: contextlib.AsyncExitStack) -> int:
    """Echo sandboxes "a" on 127.0.0.1 and "b" on 127.0.0.2, on one port (a pool has one grpc_port): the port
    the kernel gave "a" may be in use on 127.0.0.2 (another test's socket), then both are tried again."""
    for _ in range(20):
        async with contextlib.AsyncExitStack() as attempt:
            port = (await attempt.enter_async_context(echo_server("127.0.0.1", name="a")))[1]
            try:
                await attempt.enter_async_context(echo_server("127.0.0.2", port, name="b"))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue
            stack.push_async_exit(attempt.pop_all())
            return port
    raise AssertionError("no port was free on both 127.0.0.1 and 127.0.0.2 in 20 tries")


async def test_two_sessions_never_cross(tmp_path):
    """Two sandboxes on two hosts: every call reaches its own session's sandbox, told its own ID."""
    async with contextlib.AsyncExitStack() as sandboxes:
        port = await _sandboxes_on_two_hosts(sandboxes)
        policy = static_policy(tmp_path / "p.yaml", ["127.0.0.1", "127.0.0.2"], port)
        async with grpc_gateway(tmp_path, policy) as gw:
            channel = Channel(*gw.grpc_address, codec=RawCodec())
            sessions = [f"s{i}" for i in range(12)]

            async def call(session: str) -> tuple[str, dict[str, Any]]:
                got = await run_call(channel, "/test.Echo/Meta", UNARY, [b"{}"], metadata=ident(session))
                return session, json.loads(got["messages"][0])

            try:
                answers = await asyncio.gather(*(call(s) for s in sessions * 3))
            finally:
                channel.close()
            placed = {}
            for session, answer in answers:
                assert answer["metadata"]["x-sandbox-id"] == per_session_sandbox_id(session)
                assert placed.setdefault(session, answer["sandbox"]) == answer["sandbox"]
            assert set(placed.values()) == {"a", "b"}  # both sandboxes served (12 sessions, two hosts)


async def test_capacity_is_resource_exhausted_with_retry_after(sandbox, tmp_path):
    _, port = sandbox
    async with grpc_gateway(tmp_path, static_policy(tmp_path / "p.yaml", ["127.0.0.1"], port),
                            max_streams_per_org=1) as gw:
        channel = Channel(*gw.grpc_address, codec=RawCodec())
        try:
            async with channel.request("/test.Echo/Slow", UNARY, bytes, bytes, metadata=ident()) as slow:
                await slow.send_message(b"x", end=True)
                await asyncio.wait_for(sandbox[0].slow_started.wait(), 10)
                got = await run_call(channel, "/test.Echo/Unary", UNARY, [b"x"])
                await slow.cancel()
        finally:
            channel.close()
    assert got["status"] is Status.RESOURCE_EXHAUSTED
    assert ("retry-after", "5") in got["trailing"] or ("retry-after", "5") in got["initial"]


async def test_metrics_count_calls_by_method_and_status(channels, gateway):
    _, front = channels
    await run_call(front, "/test.Echo/Unary", UNARY, [b"x"])
    await run_call(front, "/test.Echo/Fail", UNARY, [b"x"])
    text = gateway.metrics.exposition()[0].decode()
    assert 'sgw_grpc_calls_total{code="OK",method="/test.Echo/Unary"} 1.0' in text
    assert 'sgw_grpc_calls_total{code="FAILED_PRECONDITION",method="/test.Echo/Fail"} 1.0' in text


async def test_a_client_reset_mid_stream_is_not_an_error_for_the_front(channels, sandbox):
    """After a client goes away mid-stream, the front keeps serving others."""
    _, front = channels
    async with front.request("/test.Echo/ServerStream", SERVER_STREAM, bytes, bytes, metadata=ident()) as stream:
        await stream.send_message(b"100000:1024", end=True)
        assert len(await stream.recv_message()) == 1024
        await stream.cancel()
    assert (await run_call(front, "/test.Echo/Unary", UNARY, [b"y"]))["messages"] == [b"y"]


async def test_calls_beyond_the_sandboxs_stream_limit_all_reach_it(channels, sandbox):
    """grpclib's sandbox takes 100 concurrent streams per connection. Every client's calls to it share the
    front's connection, so the front opens another rather than hold the 101st call back: 150 Slow calls
    through the gateway all run in the sandbox at once, as they would direct from 150 clients."""
    service, _ = sandbox
    _, front = channels
    calls = [asyncio.create_task(run_call(front, "/test.Echo/Slow", UNARY, [b"x"])) for _ in range(150)]
    try:
        async with asyncio.timeout(10):
            while service.slow_running < 150:
                service.slow_started.clear()
                await service.slow_started.wait()
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


async def test_a_slow_reader_pauses_the_sandbox(channels, sandbox):
    """Flow control end to end: while the client reads nothing, the sandbox cannot get far ahead of it
    (HTTP/2 windows of a few MiB per hop), and the gateway holds no more than its window in between."""
    service, _ = sandbox
    _, front = channels
    async with front.request("/test.Echo/Flood", SERVER_STREAM, bytes, bytes, metadata=ident()) as stream:
        await stream.send_message(b"go", end=True)
        assert len(await stream.recv_message()) == 65536
        await asyncio.sleep(1.0)  # a stall cannot be awaited as an event: give the sandbox time to run ahead
        stalled_at = service.flooded
        assert stalled_at * 65536 < 32 * 1024 * 1024, f"the sandbox sent {stalled_at} messages to a client reading none"
        received = 1
        async for _ in stream:  # reading resumes the sandbox, to the end
            received += 1
    assert received == 2000 and service.flooded == 2000


async def test_a_call_whose_client_reads_nothing_does_not_stall_the_others_to_its_sandbox(gateway, sandbox):
    """Calls to a sandbox share the front's connection to it. One whose client reads nothing holds only its
    own stream's window there: another client's call to the same sandbox still completes, its 100 KB answer
    included (with a connection window reopened only as calls read, the stuck call held all of it)."""
    service, _ = sandbox
    stuck = Channel(*gateway.grpc_address, codec=RawCodec())
    other = Channel(*gateway.grpc_address, codec=RawCodec())
    try:
        async with stuck.request("/test.Echo/Flood", SERVER_STREAM, bytes, bytes, metadata=ident()) as stream:
            await stream.send_message(b"go", end=True)
            await stream.recv_message()
            await asyncio.sleep(0.5)  # a stall cannot be awaited as an event: let the flood fill what it can
            got = await asyncio.wait_for(run_call(other, "/test.Echo/Unary", UNARY, [b"y" * 100_000]), 5)
            assert got["messages"] == [b"y" * 100_000] and service.flooded < 2000
            await stream.cancel()  # grpclib's client would otherwise wait for the flood's trailers on leaving
    finally:
        stuck.close()
        other.close()


async def test_a_slow_sandbox_pauses_the_client(channels, sandbox):
    """Flow control end to end the other way: while the sandbox reads nothing, the client's sends stall
    after a few HTTP/2 windows; once it reads, every byte arrives."""
    service, _ = sandbox
    _, front = channels
    sent = 0

    async def send_all(stream: Any) -> None:
        nonlocal sent
        for _ in range(1000):
            await stream.send_message(b"s" * 65536)
            sent += 1
        await stream.end()

    async with front.request("/test.Echo/Sink", CLIENT_STREAM, bytes, bytes, metadata=ident()) as stream:
        sender = asyncio.create_task(send_all(stream))
        await asyncio.sleep(1.0)  # a stall cannot be awaited as an event: give the client time to run ahead
        assert not sender.done() and sent * 65536 < 32 * 1024 * 1024, f"the client sent {sent} messages unread"
        service.sink_open.set()
        await sender
        assert await stream.recv_message() == str(1000 * 65536).encode()
    assert service.sunk == 1000 * 65536


@pytest.mark.parametrize("size", [pytest.param(100, id="small request"),
                                  pytest.param(4 * 1024 * 1024, id="request beyond the windows")])
async def test_a_sandbox_answering_before_it_reads_the_request(channels, size):
    """The sandbox's status reaches the client whether the request was all sent at once or is still
    being sent (then the client is told to stop sending), as it does direct."""
    direct, front = channels
    results = []
    for channel in (direct, front):
        with pytest.raises(GRPCError) as caught:
            async with channel.request("/test.Echo/Early", CLIENT_STREAM, bytes, bytes, metadata=ident()) as stream:
                await stream.send_request()
                sending = asyncio.create_task(stream.send_message(b"e" * size, end=True))
                try:
                    await stream.recv_message()
                except StreamTerminatedError:  # grpclib's client: the reset can overtake the status here
                    pass
                finally:
                    await asyncio.wait([sending])  # the sending ends (sent, or stopped by a reset: racy, either way)
                    if not sending.cancelled():
                        sending.exception()
        results.append((caught.value.status, caught.value.message))
    assert results[0] == results[1] == (Status.FAILED_PRECONDITION, "answered before reading")


async def _raw_h2_calls(address: Any, calls: dict[int, tuple[bytes, list[bytes]]]
                        ) -> dict[int, tuple[dict[bytes, bytes], bytes]]:
    """Unary calls written with h2, all in one write: {stream id: (x-note value, DATA payloads, the last
    ending the stream)} -> {stream id: (response headers and trailers, response body)}."""
    reader, writer = await asyncio.open_connection(*address)
    client = h2.connection.H2Connection(H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    for stream_id, (note, payloads) in calls.items():
        client.send_headers(stream_id, [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/test.Echo/Unary"),
                                        (b":authority", b"gw"), (b"content-type", b"application/grpc"),
                                        (b"te", b"trailers"), (b"x-user-id", b"u1"), (b"x-session-id", b"s1"),
                                        (b"x-note", note)])
        for i, payload in enumerate(payloads):
            client.send_data(stream_id, payload, end_stream=i == len(payloads) - 1)
    writer.write(client.data_to_send())
    heads: dict[int, dict[bytes, bytes]] = {stream_id: {} for stream_id in calls}
    bodies = dict.fromkeys(calls, b"")
    ended: set[int] = set()
    while ended != set(calls):
        data = await reader.read(65536)
        assert data, "the gateway closed the connection"
        for event in client.receive_data(data):
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                heads[event.stream_id].update(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                bodies[event.stream_id] += event.data
            elif isinstance(event, h2.events.StreamEnded):
                ended.add(event.stream_id)
        writer.write(client.data_to_send())
    writer.close()
    await writer.wait_closed()
    return {stream_id: (heads[stream_id], bodies[stream_id]) for stream_id in calls}


async def test_a_non_ascii_metadata_value_is_refused_for_its_call_only(gateway, sandbox):
    """gRPC metadata values are ASCII. One that is not gets INVALID_ARGUMENT for its own call; the other
    calls on the connection (and on the sandbox's, shared with other clients) go on."""
    service, _ = sandbox
    answers = await _raw_h2_calls(gateway.grpc_address, {1: ("caf\u00e9".encode(), [b"\x00\x00\x00\x00\x02hi"]),
                                                         3: (b"plain", [b"\x00\x00\x00\x00\x02hi"])})
    refused, served = answers[1][0], answers[3][0]
    assert refused[b"grpc-status"] == b"3" and refused[b"grpc-message"].startswith(b"bad_request: x-note: ")
    assert served[b"grpc-status"] == b"0"
    assert [seen.get("x-note") for seen in service.seen] == ["plain"]



async def test_a_finished_call_is_freed_without_the_cyclic_gc(channels):
    """The front's per-call objects (the call, its streams, their buffers and owners) hold no reference
    cycle once the call ends: freed as it finishes, not left to collections that cost the gateway about a
    tenth of its time under load."""
    import gc

    from gateway.grpcfront.call import Call, _Side
    from gateway.grpcfront.relay import RelayBuffer
    from gateway.grpcfront.stream import Stream

    _, front = channels
    await run_call(front, "/test.Echo/Unary", UNARY, [b"warm"])
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(20):
            assert (await run_call(front, "/test.Echo/Unary", UNARY, [b"x"]))["messages"] == [b"x"]
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if isinstance(o, (Call, Stream, RelayBuffer, _Side))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []


def test_the_fronts_head_memos_keep_only_small_heads_and_start_over_when_full():
    """head.remember, the one bound of the request-head memos (per connection in Call._admit, front-wide in
    sandbox_head): a head over HEAD_REMEMBERED_SIZE bytes is never kept, and a full memo starts over."""
    from gateway.grpcfront.head import HEAD_REMEMBERED_SIZE, remember

    memo: dict = {}
    big = ((b"x-big", b"v" * HEAD_REMEMBERED_SIZE),)
    remember(memo, "big", "read", big, 2)
    assert memo == {}
    for key in ("a", "b"):
        remember(memo, key, key.upper(), ((b"x", key.encode()),), 2)
    assert memo == {"a": "A", "b": "B"}
    remember(memo, "c", "C", ((b"x", b"c"),), 2)
    assert memo == {"c": "C"}


def test_the_sandbox_head_is_remembered_with_the_clients_timeout_as_it_came():
    """head.sandbox_head: one tuple per head and grpc-timeout value as the client sent it (what the sandbox
    connection's encoder then knows by identity), the timeout last, after the sandbox id; the time left, counted
    down for one call, is not kept."""
    from gateway.grpcfront.head import sandbox_head

    heads: dict = {}
    out = ((b"content-type", b"application/grpc"),)
    first = sandbox_head(heads, out, "/a.B/C", ("10.0.0.1", 50051), "ses-1", b"701m", True)
    assert sandbox_head(heads, out, "/a.B/C", ("10.0.0.1", 50051), "ses-1", b"701m", True) is first
    assert first[-2:] == ((b"x-sandbox-id", b"ses-1"), (b"grpc-timeout", b"701m"))
    other = sandbox_head(heads, out, "/a.B/C", ("10.0.0.1", 50051), "ses-1", b"5S", True)
    untimed = sandbox_head(heads, out, "/a.B/C", ("10.0.0.1", 50051), "ses-1", None, True)
    assert other[-1] == (b"grpc-timeout", b"5S") and untimed[-1] == (b"x-sandbox-id", b"ses-1")
    assert first[:-1] == other[:-1] == untimed
    counted = sandbox_head(heads, out, "/a.B/C", ("10.0.0.1", 50051), "ses-1", b"699m", False)
    assert counted[-1] == (b"grpc-timeout", b"699m") and len(heads) == 3  # the time left: never kept
