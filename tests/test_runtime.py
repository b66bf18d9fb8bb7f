"""The reference sandbox runtime, over real loopback sockets.

Traversal tests send paths byte for byte (``URL(..., encoded=True)``): the
client would otherwise remove ``..`` segments before the server ever saw them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient
from yarl import URL

from gateway.runtime import create_app
from gateway.runtime.execute import run_command

SANDBOX_ID = "sandbox-test"
PROJECT_ROOT = Path(__file__).resolve().parent.parent

Client = TestClient[web.Request, web.Application]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path, root: Path) -> Path:
    """A directory beside root holding a secret, reachable from root via ``escape``."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("secret")
    (root / "escape").symlink_to(path, target_is_directory=True)
    return path


@pytest.fixture
async def client(aiohttp_client: AiohttpClient, root: Path, outside: Path) -> Client:
    return await aiohttp_client(create_app(root, SANDBOX_ID))


def raw_url(client: Client, path: str) -> URL:
    """``path`` exactly as written: no dot-segment removal, no re-quoting."""
    return URL(f"http://{client.host}:{client.port}{path}", encoded=True)


async def upload(client: Client, filename: str, data: bytes) -> aiohttp.ClientResponse:
    # quote_fields=False: send the filename as requests/httpx do (the
    # agent-sandbox clients); aiohttp's default would percent-encode it.
    form = aiohttp.FormData(quote_fields=False)
    form.add_field("file", data, filename=filename, content_type="application/octet-stream")
    return await client.post("/upload", data=form)


async def assert_error(resp: aiohttp.ClientResponse, status: int, code: str) -> None:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    assert resp.headers["X-Runtime-Sandbox-Id"] == SANDBOX_ID


async def test_health(client: Client) -> None:
    resp = await client.get("/")
    assert resp.status == 200
    assert await resp.json() == {"status": "ok", "sandbox_id": SANDBOX_ID}
    assert resp.headers["X-Runtime-Sandbox-Id"] == SANDBOX_ID


# --- /execute ---------------------------------------------------------------


async def test_execute_runs_in_root(client: Client, root: Path) -> None:
    resp = await client.post("/execute", json={"command": "echo out; echo err >&2; pwd"})
    assert resp.status == 200
    assert await resp.json() == {"stdout": f"out\n{root.resolve()}\n", "stderr": "err\n", "exit_code": 0,
                                  "timed_out": False}


async def test_execute_reports_non_zero_exit(client: Client) -> None:
    resp = await client.post("/execute", json={"command": "exit 7"})
    body = await resp.json()
    assert body["exit_code"] == 7 and body["timed_out"] is False  # an exit code of its own is not a timeout


async def test_execute_reports_signal_as_128_plus_n(client: Client) -> None:
    resp = await client.post("/execute", json={"command": "kill -TERM $$"})
    assert (await resp.json())["exit_code"] == 128 + signal.SIGTERM


async def test_execute_timeout_kills_the_process_group(client: Client) -> None:
    # The background sleep keeps the pipes open: only killing the whole group
    # (and not waiting for EOF) lets the call return.
    resp = await client.post("/execute", json={"command": "echo started; sleep 60 & sleep 60", "timeout_seconds": 0.3})
    assert resp.status == 200
    body = await resp.json()
    assert body["exit_code"] == 124 and body["timed_out"] is True  # the agent-sandbox SDK reads timed_out
    assert body["stdout"] == "started\n"
    assert "timed out after 0.3s" in body["stderr"]


async def test_cancelled_command_is_killed(root: Path) -> None:
    """A request that goes away (handler cancelled) takes its command with it."""
    ready = root / "ready"
    os.mkfifo(ready)
    task = asyncio.create_task(
        run_command("echo $$ > ready; exec sleep 60", cwd=root, timeout=60, max_output_bytes=1000)
    )
    # Read the FIFO through the loop (O_RDWR: opening never blocks and we
    # never see a premature EOF): the pid arrives once the command runs.
    reader = asyncio.StreamReader()
    pipe = os.fdopen(os.open(ready, os.O_RDWR | os.O_NONBLOCK), "rb", buffering=0)
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe
    )
    try:
        pid = int(await asyncio.wait_for(reader.readline(), timeout=30))
    finally:
        transport.close()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)


async def test_execute_truncates_output(aiohttp_client: AiohttpClient, root: Path) -> None:
    client = await aiohttp_client(create_app(root, SANDBOX_ID, max_output_bytes=1000))
    resp = await client.post("/execute", json={"command": "head -c 5000 /dev/zero | tr '\\0' a; echo e >&2"})
    body = await resp.json()
    assert body["exit_code"] == 0
    assert body["stdout"].startswith("a" * 1000 + "\n[sandbox-runtime: stdout truncated after 1000 bytes; 4000")
    assert body["stderr"] == "e\n"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        pytest.param(b"{not json", "invalid_json", id="malformed JSON"),
        pytest.param(b"\xff\xfe", "invalid_json", id="not UTF-8"),
        pytest.param(b'["ls"]', "invalid_body", id="array instead of object"),
        pytest.param(b"{}", "invalid_command", id="missing command"),
        pytest.param(b'{"command": 42}', "invalid_command", id="command not a string"),
        pytest.param(b'{"command": "ls", "timeout_seconds": "5"}', "invalid_timeout", id="timeout as string"),
        pytest.param(b'{"command": "ls", "timeout_seconds": true}', "invalid_timeout", id="timeout as bool"),
        pytest.param(b'{"command": "ls", "timeout_seconds": 0}', "invalid_timeout", id="zero timeout"),
        pytest.param(b'{"command": "ls", "timeout_seconds": -1}', "invalid_timeout", id="negative timeout"),
        pytest.param(b'{"command": "ls", "timeout_seconds": 1e400}', "invalid_timeout", id="infinite timeout"),
    ],
)
async def test_execute_rejects_bad_input(client: Client, body: bytes, code: str) -> None:
    resp = await client.post("/execute", data=body, headers={"Content-Type": "application/json"})
    await assert_error(resp, 400, code)


# --- files ------------------------------------------------------------------


async def test_upload_download_list_exists(client: Client, root: Path) -> None:
    data = os.urandom(1024 * 1024)
    resp = await upload(client, "blob.bin", data)
    assert resp.status == 200
    assert await resp.json() == {"path": "blob.bin", "size": len(data)}

    resp = await client.get("/download/blob.bin")
    assert resp.status == 200
    assert await resp.read() == data

    assert await (await client.get("/list")).json() == await (await client.get("/list/")).json()
    resp = await client.get("/list/")
    entries = {entry["name"]: entry for entry in await resp.json()}
    assert entries["blob.bin"]["size"] == len(data)
    assert entries["blob.bin"]["type"] == "file"
    assert entries["blob.bin"]["mod_time"] == pytest.approx((root / "blob.bin").stat().st_mtime)
    # A symlink pointing outside root is listed as the link, never its target.
    assert entries["escape"]["type"] == "file"

    assert await (await client.get("/exists/blob.bin")).json() == {"path": "blob.bin", "exists": True}
    assert await (await client.get("/exists/nope.bin")).json() == {"path": "nope.bin", "exists": False}


async def test_nested_paths_use_encoded_slashes(client: Client, root: Path) -> None:
    resp = await upload(client, "dir/sub/file.txt", b"nested")
    assert await resp.json() == {"path": "dir/sub/file.txt", "size": 6}
    assert (root / "dir" / "sub" / "file.txt").read_bytes() == b"nested"

    async with client.session.get(raw_url(client, "/download/dir%2Fsub%2Ffile.txt")) as resp:
        assert resp.status == 200
        assert await resp.read() == b"nested"
    async with client.session.get(raw_url(client, "/list/dir%2Fsub")) as resp:
        assert [entry["name"] for entry in await resp.json()] == ["file.txt"]
    async with client.session.get(raw_url(client, "/list/dir")) as resp:
        assert await resp.json() == [{"name": "sub", "size": 0, "type": "directory", "mod_time": pytest.approx(
            (root / "dir" / "sub").stat().st_mtime)}]
    async with client.session.get(raw_url(client, "/exists/dir%2Fsub%2Ffile.txt")) as resp:
        assert (await resp.json())["exists"] is True


async def test_upload_filename_is_taken_literally(client: Client, root: Path) -> None:
    """No percent-decoding of the multipart filename, as the python-runtime does."""
    resp = await upload(client, "a%2Fb.txt", b"literal")
    assert await resp.json() == {"path": "a%2Fb.txt", "size": 7}
    assert (root / "a%2Fb.txt").read_bytes() == b"literal"
    async with client.session.get(raw_url(client, "/download/a%252Fb.txt")) as resp:
        assert await resp.read() == b"literal"


async def test_upload_overwrites_atomically(client: Client, root: Path) -> None:
    await upload(client, "f.txt", b"first version")
    await upload(client, "f.txt", b"second")
    assert (root / "f.txt").read_bytes() == b"second"
    assert sorted(p.name for p in root.iterdir()) == ["escape", "f.txt"]  # no temp files left behind


TRAVERSALS = [
    pytest.param("..", id="dot-dot"),
    pytest.param("../../etc/passwd", id="dot-dot etc/passwd"),
    pytest.param("%2e%2e/", id="encoded dot-dot"),
    pytest.param("%2e%2e%2fetc%2fpasswd", id="fully encoded traversal"),
    pytest.param("%2E%2E%2F..%2Foutside%2Fsecret.txt", id="upper-case encoded traversal"),
    pytest.param("%2Fetc%2Fpasswd", id="encoded absolute path"),
    pytest.param("sub/../../outside/secret.txt", id="traversal after a segment"),
    pytest.param("escape", id="symlink pointing outside"),
    pytest.param("escape%2Fsecret.txt", id="file behind outside symlink"),
]


@pytest.mark.parametrize("endpoint", ["download", "list", "exists"])
@pytest.mark.parametrize("path", TRAVERSALS)
async def test_traversal_is_forbidden(client: Client, endpoint: str, path: str) -> None:
    async with client.session.get(raw_url(client, f"/{endpoint}/{path}")) as resp:
        await assert_error(resp, 403, "path_outside_root")


@pytest.mark.parametrize(
    "filename",
    [
        pytest.param("..", id="dot-dot"),
        pytest.param("../evil.txt", id="dot-dot file"),
        pytest.param("../../etc/passwd", id="dot-dot etc/passwd"),
        pytest.param("/etc/passwd", id="absolute path"),
        pytest.param("escape/secret.txt", id="through outside symlink"),
        pytest.param("escape/new/deep.txt", id="new dirs through outside symlink"),
    ],
)
async def test_upload_traversal_is_forbidden(client: Client, outside: Path, filename: str) -> None:
    before = sorted(outside.parent.rglob("*"))
    await assert_error(await upload(client, filename, b"pwned"), 403, "path_outside_root")
    assert sorted(outside.parent.rglob("*")) == before
    assert (outside / "secret.txt").read_text() == "secret"


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        pytest.param("GET", "/download/missing.txt", 404, "not_found", id="download missing"),
        pytest.param("GET", "/download/dir", 400, "is_a_directory", id="download a directory"),
        pytest.param("GET", "/list/missing", 404, "not_found", id="list missing"),
        pytest.param("GET", "/list/dir%2Ffile.txt", 400, "not_a_directory", id="list a file"),
        pytest.param("GET", "/download/a%00b", 400, "invalid_path", id="NUL byte"),
        pytest.param("GET", "/exists/loop", 400, "invalid_path", id="symlink loop"),
        pytest.param("GET", "/events?count=x", 400, "invalid_count", id="bad SSE count"),
        pytest.param("GET", "/events?count=10001", 400, "invalid_count", id="SSE count over max"),
        pytest.param("GET", "/events?interval_ms=-5", 400, "invalid_interval_ms", id="bad SSE interval"),
        pytest.param("GET", "/no/such/route", 404, "not_found", id="unknown route"),
        pytest.param("PUT", "/execute", 405, "method_not_allowed", id="wrong method"),
        pytest.param("POST", "/upload", 400, "not_multipart", id="upload without multipart"),
    ],
)
async def test_errors_are_json(client: Client, root: Path, method: str, path: str, status: int, code: str) -> None:
    (root / "dir").mkdir()
    (root / "dir" / "file.txt").write_text("x")
    (root / "loop").symlink_to("loop")
    async with client.session.request(method, raw_url(client, path)) as resp:
        await assert_error(resp, status, code)


@pytest.mark.parametrize(
    ("content_type", "body", "code"),
    [
        pytest.param(
            "multipart/form-data; boundary=B",
            b'--B\r\nContent-Disposition: form-data; name="other"; filename="x.txt"\r\n\r\nx\r\n--B--\r\n',
            "missing_file",
            id="no file field",
        ),
        pytest.param(
            "multipart/form-data; boundary=B",
            b'--B\r\nContent-Disposition: form-data; name="file"\r\n\r\nx\r\n--B--\r\n',
            "missing_filename",
            id="file field without filename",
        ),
        pytest.param("multipart/form-data", b"x", "bad_multipart", id="no boundary"),
        pytest.param("multipart/form-data; boundary=B", b"garbage", "bad_multipart", id="garbage body"),
    ],
)
async def test_upload_rejects_bad_multipart(client: Client, content_type: str, body: bytes, code: str) -> None:
    resp = await client.post("/upload", data=body, headers={"Content-Type": content_type})
    await assert_error(resp, 400, code)


async def test_upload_over_a_file_parent_is_rejected(client: Client, root: Path) -> None:
    (root / "plain").write_text("x")
    await assert_error(await upload(client, "plain/child.txt", b"x"), 400, "not_a_directory")


# --- streams ----------------------------------------------------------------


async def read_event(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    raw = await resp.content.readuntil(b"\n\n")
    fields = dict(line.split(": ", 1) for line in raw.decode().strip("\n").split("\n"))
    return {"id": int(fields["id"]), "event": fields["event"], "data": json.loads(fields["data"])}


async def test_sse_flushes_each_event(client: Client) -> None:
    # The second event is due a minute later: the first can only arrive now
    # if it was flushed on its own.
    async with client.get("/events", params={"count": "2", "interval_ms": "60000"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["X-Runtime-Sandbox-Id"] == SANDBOX_ID
        first = await asyncio.wait_for(read_event(resp), timeout=10)
        assert first == {"id": 1, "event": "tick", "data": {"n": 1, "sandbox_id": SANDBOX_ID}}


async def test_sse_events_in_order_then_end(client: Client) -> None:
    async with client.get("/events", params={"count": "5", "interval_ms": "1"}) as resp:
        ids = [(await read_event(resp))["id"] for _ in range(5)]
        assert ids == [1, 2, 3, 4, 5]
        assert await resp.content.read() == b""  # the stream ends after `count`


async def test_sse_unbounded_until_client_leaves(client: Client) -> None:
    async with client.get("/events", params={"count": "0", "interval_ms": "1"}) as resp:
        events = [await read_event(resp) for _ in range(20)]
    assert [event["data"]["n"] for event in events] == list(range(1, 21))


async def test_websocket_echo_and_client_close(client: Client) -> None:
    async with client.ws_connect("/ws") as ws:
        await ws.send_str("hello")
        assert await ws.receive_str() == "hello"
        await ws.send_bytes(b"\x00\xffbinary")
        assert await ws.receive_bytes() == b"\x00\xffbinary"
        await ws.send_str("close:not-a-code")  # malformed: plain echo
        assert await ws.receive_str() == "close:not-a-code"
        await ws.close(code=1000)
    assert ws.closed
    assert ws.close_code == 1000


async def test_websocket_server_close_code_reaches_client(client: Client) -> None:
    async with client.ws_connect("/ws") as ws:
        await ws.send_str("close:4001:bye now")
        msg = await ws.receive()
        assert msg.type is WSMsgType.CLOSE
        assert (msg.data, msg.extra) == (4001, "bye now")
    assert ws.close_code == 4001


async def test_echo_reports_the_request_exactly(client: Client) -> None:
    body = os.urandom(300_000)
    headers = [("X-Multi", "one"), ("X-Multi", "two"), ("X-Single", "v")]
    async with client.session.post(raw_url(client, "/echo/a%2Fb?x=%20"), data=body, headers=headers) as resp:
        assert resp.status == 200
        echo = await resp.json()
    assert echo["method"] == "POST"
    assert echo["raw_path"] == "/echo/a%2Fb?x=%20"
    assert echo["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert echo["body_len"] == len(body)
    assert echo["headers"]["X-Multi"] == "one, two"
    assert echo["headers"]["X-Single"] == "v"
    assert echo["sandbox_id"] == SANDBOX_ID


# --- the process ------------------------------------------------------------


async def test_process_reports_port_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.runtime",
        "--host", "127.0.0.1", "--port", "0", "--root", str(tmp_path / "sbx"), "--sandbox-id", "x",
        cwd=PROJECT_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
        word, host, port = line.decode().split()
        assert (word, host) == ("LISTENING", "127.0.0.1")
        base = URL(f"http://127.0.0.1:{int(port)}")
        async with aiohttp.ClientSession() as session:
            async with session.get(base / "") as resp:
                assert await resp.json() == {"status": "ok", "sandbox_id": "x"}
            async with session.ws_connect(base / "ws") as ws:
                proc.send_signal(signal.SIGTERM)
                # Open WebSockets are told the sandbox is going away.
                msg = await asyncio.wait_for(ws.receive(), timeout=30)
                assert (msg.type, msg.data) == (WSMsgType.CLOSE, aiohttp.WSCloseCode.GOING_AWAY)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
        assert await proc.stdout.read() == b""  # nothing but the LISTENING line
        assert await proc.stderr.read() == b""
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
