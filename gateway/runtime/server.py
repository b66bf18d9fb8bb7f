"""The reference sandbox runtime: one aiohttp app per sandbox process.

It speaks the kubernetes-sigs/agent-sandbox python-runtime API (``/``,
``/execute``, ``/upload``, ``/download``, ``/list``, ``/exists``) so existing
clients work against it, plus test endpoints for the gateway's proxy
(``/events`` SSE, ``/ws`` WebSocket, ``/echo``). The local provider runs one
of these per sandbox; the tests run it in-process with :func:`create_app`.

Every response carries ``X-Runtime-Sandbox-Id`` so a test can tell which
sandbox answered, and every error has the contract's JSON shape.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from .config import CONFIG, DEFAULT_MAX_OUTPUT_BYTES, LISTEN_BACKLOG, RuntimeConfig
from .errors import RuntimeApiError
from .execute import handle_execute
from .files import handle_download, handle_exists, handle_list, handle_upload
from .streams import WEBSOCKETS, close_websockets, handle_events, handle_ws

log = logging.getLogger(__name__)

SANDBOX_ID_HEADER = "X-Runtime-Sandbox-Id"
#: Bound on how long shutdown waits for in-flight requests before cancelling them.
SHUTDOWN_TIMEOUT_SECONDS = 5.0
#: The longest request target answered; a longer one gets 414 uri_too_long (JSON, like every error).
MAX_URL_BYTES = 8190
#: What the HTTP parser reads of a request line before it gives up with its own plain-text 400: far
#: above MAX_URL_BYTES (and above the gateway's 32 KiB head limit), so a long URL reaches the 414.
_MAX_LINE_BYTES = 65536

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# aiohttp's own errors (no route, wrong method, body too large) get snake_case codes too.
_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
}


def error_body(status: int, code: str, message: str) -> web.Response:
    """The contract's error shape: ``{"error": {"code", "message"}}``."""
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Translate every error into JSON, here and only here.

    Streaming handlers raise only before they prepare their response; a
    failure after that is theirs to handle (aiohttp closes the connection).
    """
    try:
        if len(request.raw_path) > MAX_URL_BYTES:
            return error_body(414, "uri_too_long", f"the request target is {len(request.raw_path)} bytes; the "
                              f"runtime takes at most {MAX_URL_BYTES}: send long data in the body")
        return await handler(request)
    except RuntimeApiError as exc:
        return error_body(exc.status, exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.text or exc.reason
        if message == f"{exc.status}: {exc.reason}":  # aiohttp's default text says nothing useful
            message = f"{request.method} {request.path}: {exc.reason}"
        response = error_body(exc.status, _HTTP_CODES.get(exc.status, f"http_{exc.status}"), message)
        if allow := exc.headers.get("Allow"):
            response.headers["Allow"] = allow
        return response
    except ConnectionResetError:
        raise  # the client is gone: there is nobody to answer
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_body(500, "internal_error", "the sandbox runtime failed; see its log")


async def handle_health(request: web.Request) -> web.Response:
    """``GET /``: the readiness probe the local provider polls."""
    return web.json_response({"status": "ok", "sandbox_id": request.app[CONFIG].sandbox_id})


async def handle_echo(request: web.Request) -> web.Response:
    """``* /echo/{tail}``: describe the request exactly as it arrived.

    ``raw_path`` is byte-exact (query included) so proxy tests can check that
    nothing re-encoded it; the body is hashed chunk by chunk, never buffered.
    """
    digest = hashlib.sha256()
    length = 0
    async for chunk in request.content.iter_any():
        digest.update(chunk)
        length += len(chunk)
    headers: dict[str, str] = {}
    seen: set[str] = set()
    for name in request.headers:
        if name.lower() not in seen:
            seen.add(name.lower())
            headers[name] = ", ".join(request.headers.getall(name))
    return web.json_response(
        {
            "method": request.method,
            "raw_path": request.raw_path,
            "headers": headers,
            "body_sha256": digest.hexdigest(),
            "body_len": length,
            "sandbox_id": request.app[CONFIG].sandbox_id,
        }
    )


def create_app(
    root: Path, sandbox_id: str = "", *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
) -> web.Application:
    """Build the runtime app serving ``root`` (created if missing) as ``sandbox_id``.

    ``max_output_bytes`` caps what ``/execute`` keeps of each of stdout and
    stderr; tests lower it to exercise truncation cheaply.
    """
    root.mkdir(parents=True, exist_ok=True)
    config = RuntimeConfig(root=root.resolve(strict=True), sandbox_id=sandbox_id, max_output_bytes=max_output_bytes)
    app = web.Application(middlewares=[error_middleware])
    app[CONFIG] = config
    app[WEBSOCKETS] = set()

    async def stamp_sandbox_id(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SANDBOX_ID_HEADER] = sandbox_id

    async def stop_streams(app: web.Application) -> None:
        config.stopping.set()

    app.on_response_prepare.append(stamp_sandbox_id)
    app.on_shutdown.append(stop_streams)
    app.on_shutdown.append(close_websockets)
    app.router.add_get("/", handle_health)
    app.router.add_post("/execute", handle_execute)
    app.router.add_post("/upload", handle_upload)
    app.router.add_get("/download/{path:.+}", handle_download)
    app.router.add_get("/list", handle_list)
    app.router.add_get("/list/{path:.*}", handle_list)
    app.router.add_get("/exists/{path:.*}", handle_exists)
    app.router.add_get("/events", handle_events)
    app.router.add_get("/ws", handle_ws)
    app.router.add_route("*", "/echo", handle_echo)
    app.router.add_route("*", "/echo/{tail:.*}", handle_echo)
    return app


async def serve(host: str, port: int, root: Path, sandbox_id: str = "", *, listen_fd: int | None = None,
                grpc_port: int | None = None, grpc_fd: int | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then drain briefly and return.

    Prints ``LISTENING <host> <port>`` once bound (the real port when 0 was
    asked for), or ``LISTENING fd <n>`` when serving an inherited socket
    (``listen_fd``): the local provider reads that line to know we started.
    With ``grpc_port`` the gRPC service (``grpc_service``) serves too, and
    ``GRPC_LISTENING <host> <port>`` follows. With ``grpc_fd`` it serves on that
    inherited socket, started before ``LISTENING`` and announced by nothing: the
    local provider reads that one line and then closes the pipe.
    """
    app = create_app(root, sandbox_id)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS,
        # A client that disconnects cancels its handler, which kills its command.
        handler_cancellation=True,
        max_line_size=_MAX_LINE_BYTES,
    )
    await runner.setup()
    grpc = None
    try:
        if grpc_fd is not None:
            grpc = await _start_grpc_on(socket.socket(fileno=grpc_fd), app[CONFIG])
        if listen_fd is not None:
            await web.SockSite(runner, socket.socket(fileno=listen_fd), backlog=LISTEN_BACKLOG).start()
            print(f"LISTENING fd {listen_fd}", flush=True)
        else:
            await web.TCPSite(runner, host, port).start()
            print(f"LISTENING {host} {runner.addresses[0][1]}", flush=True)
        if grpc_port is not None:
            grpc = await _start_grpc(host, grpc_port, app[CONFIG])
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        if grpc is not None:
            grpc.close()
            await grpc.wait_closed()
        await runner.cleanup()


async def _start_grpc(host: str, port: int, config: RuntimeConfig) -> Any:
    from .grpc_service import create_server

    server = create_server(config.root, config.sandbox_id, config.max_output_bytes)
    await server.start(host, port)
    bound = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # grpclib keeps the asyncio server
    print(f"GRPC_LISTENING {host} {bound}", flush=True)
    return server


async def _start_grpc_on(sock: socket.socket, config: RuntimeConfig) -> Any:
    from .grpc_service import create_server

    server = create_server(config.root, config.sandbox_id, config.max_output_bytes)
    await server.start(sock=sock, backlog=LISTEN_BACKLOG)
    return server


def run(host: str, port: int, root: Path, sandbox_id: str = "", *, listen_fd: int | None = None,
        grpc_port: int | None = None, grpc_fd: int | None = None) -> None:
    """Blocking entry point for the CLI.

    The standard asyncio loop, not uvloop: uvloop's subprocesses inherited the runtime's own
    descriptors (its listening socket, a pipe), so a command's background job held a pipe of
    the runtime open and ``/execute`` waited for it until the timeout. The stdlib closes them.
    """
    with asyncio.Runner() as runner:
        runner.run(serve(host, port, root, sandbox_id, listen_fd=listen_fd, grpc_port=grpc_port, grpc_fd=grpc_fd))
