"""The control API (port 8081): sessions, sandbox access grants, kagent's sandbox API, sandboxes,
route dry runs, health.

Every error leaves through :func:`error_middleware`, the one place where a
``GatewayError`` (or aiohttp's own 404/405/413) becomes the documented JSON
shape (a page for a browser's navigation, rendered by ``gateway.errors.render``); an unexpected exception is logged with its stack and answered with a
bare 500 that says nothing about internals. Bytes that never became a request
(malformed HTTP) are answered in the same shape by :class:`ControlRunner`.
Credentials and routing headers are read one way: each may come once
(:func:`headers_middleware`), as on the data plane.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

from gateway.auth import AdminCheck, AllowAll, parse_headers
from gateway.errors import (
    BadRequest, GatewayError, NotFound, NotImplementedByGateway, UnsupportedMediaType, render, wants_html,
)
from gateway.grants import Grants, McpTarget, NoGrants
from gateway.hosts import AllowedHosts, host_not_allowed
from gateway.metrics import Metrics
from gateway.model import Binding, Position, SandboxFilter, SandboxRecord, SandboxState
from gateway.sessions import SessionRouter
from routing import Identity, InvalidIdentity, is_valid_sandbox_id
from routing.ports import PortSet

log = logging.getLogger(__name__)

ROUTER = web.AppKey("router", SessionRouter)
ADMIN = web.AppKey("admin", AdminCheck)
_OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
READINESS = web.AppKey("readiness", Callable[[], Awaitable[list[str]]])
METRICS = web.AppKey("metrics", Metrics)
GRANTS = web.AppKey("grants", Grants)
MCP_TARGET = web.AppKey("mcp_target", McpTarget)
HOSTS = web.AppKey("hosts", AllowedHosts)
#: Notices every caller of GET /v1/sandboxes sees (e.g. local sandboxes that run unconfined).
WARNINGS = web.AppKey("warnings", list)
SUSPEND_GRACE = web.AppKey("suspend_grace", float)

_IDENTITY_FIELDS = ("org_id", "user_id", "session_id", "bot_id")

# Headers that say who is calling: a second copy would leave "which one counts" to whichever
# reader looks (aiohttp's headers.get takes the first), so each must come once, as on the data
# plane. (aiohttp's parser itself refuses a second Host, and an HTTP/1.1 request without one.)
_SINGLE_HEADERS = (
    ("Authorization", "invalid_authorization"), ("X-Org-Id", "invalid_identity"), ("X-User-Id", "invalid_identity"),
    ("X-Session-Id", "invalid_identity"), ("X-Bot-Id", "invalid_identity"),
)


def error_response(exc: GatewayError, request: web.BaseRequest | None = None) -> web.Response:
    """``exc`` in the JSON shape, or as a small page when ``request`` is a browser's navigation."""
    as_html = request is not None and wants_html(request.headers.get("Sec-Fetch-Mode"), request.headers.get("Accept"))
    content_type, body, headers = render(exc, as_html=as_html)
    return web.Response(status=exc.status, body=body, headers={"Content-Type": content_type, **headers})


@web.middleware
async def error_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await handler(request)
    except GatewayError as exc:
        return error_response(exc, request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(exc.status, "bad_request")
        error = GatewayError(exc.reason, code=code)
        error.status = exc.status  # type: ignore[misc]  # keep aiohttp's status, our body shape
        return error_response(error, request)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(GatewayError("internal error; the gateway logged the details"), request)


@web.middleware
async def hosts_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Only the hosts this gateway answers for (gateway/hosts.py: DNS rebinding), health included."""
    hosts = request.app[HOSTS]
    named = [request.headers.get("Host")]
    if not request.raw_path.startswith("/"):  # absolute-form: its authority is the host (RFC 9112 3.2.2)
        named.append(request.host)
    for host in named:
        if not hosts.allows(host.encode("latin-1") if host is not None else None):
            request.app[METRICS].denied("host_not_allowed")
            raise host_not_allowed(host)
    return await handler(request)


@web.middleware
async def headers_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Credentials once each, whichever call reads them."""
    headers = request.headers
    for name, code in _SINGLE_HEADERS:
        if len(headers.getall(name, ())) > 1:
            raise BadRequest(f"{name}: must be given once", code=code)
    return await handler(request)


@web.middleware
async def admin_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Every control call but health and metrics needs an admin token (when keys are configured)."""
    if request.path not in _OPEN_PATHS:
        request.app[ADMIN].check(request.headers.get("Authorization"))
    return await handler(request)


def _identity(raw: dict[str, Any]) -> Identity:
    try:
        return Identity.parse(**{field: raw.get(field) for field in _IDENTITY_FIELDS})
    except InvalidIdentity as exc:
        raise BadRequest(str(exc), code="invalid_identity") from None


def _caller(request: web.Request, session_id: str) -> Identity | None:
    """An identity from X-* headers, when the caller sent one: then the owner check applies."""
    headers = request.headers
    if "X-User-Id" not in headers:
        return None
    return parse_headers(headers.get("X-Org-Id"), headers.get("X-User-Id"), session_id, headers.get("X-Bot-Id"))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object hook: a field given twice is an error, not "the last one wins"."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise BadRequest(f"field {key!r} is given more than once", code="invalid_json")
        obj[key] = value
    return obj


async def _json_object(request: web.Request, allowed: tuple[str, ...] = _IDENTITY_FIELDS, *,
                       optional: bool = False) -> dict[str, Any]:
    """The body as a JSON object with only ``allowed`` fields; ``{}`` for no body at all when ``optional``."""
    if optional and not request.body_exists:
        return {}
    # Only application/json: a web page can POST text/plain to localhost without a CORS preflight,
    # which would let any site create sandboxes through an embedded gateway without admin keys.
    if request.content_type != "application/json":
        raise UnsupportedMediaType("send the body as Content-Type: application/json")
    try:
        body = await request.json(loads=functools.partial(json.loads, object_pairs_hook=_unique_keys))
    except (ValueError, RecursionError):
        raise BadRequest("the request body is not valid JSON (or nests too deeply)", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r} (allowed: {', '.join(allowed)})")
    return body


def _path_session(request: web.Request) -> str:
    session_id = request.match_info["session_id"]
    try:
        Identity.parse(user_id="-", session_id=session_id)
    except InvalidIdentity as exc:
        raise BadRequest(str(exc), code="invalid_identity") from None
    return session_id


def _binding_view(binding: Binding, record: SandboxRecord | None) -> dict[str, Any]:
    return {
        "session_id": binding.session_id,
        "sandbox_id": binding.sandbox_id,
        "pool": binding.pool,
        "isolation": binding.isolation.value,
        "state": record.state.value if record is not None else "absent",
        "endpoint": record.endpoint.url() if record is not None and record.endpoint is not None else None,
    }


async def create_session(request: web.Request) -> web.Response:
    identity = _identity(await _json_object(request))
    binding, record = await request.app[ROUTER].bind(identity)
    return web.json_response(_binding_view(binding, record))


async def get_session(request: web.Request) -> web.Response:
    session_id = _path_session(request)
    router = request.app[ROUTER]
    binding = await router.lookup(session_id, _caller(request, session_id))
    return web.json_response(_binding_view(binding, await router.sandbox_of(binding)))


async def delete_session(request: web.Request) -> web.Response:
    session_id = _path_session(request)
    binding = await request.app[ROUTER].close_session(session_id, _caller(request, session_id))
    return web.json_response({"session_id": session_id, "sandbox_id": binding.sandbox_id, "deleted": True})


# -- access to a session's sandbox by URL -----------------------------------------------------
_ACCESS_FIELDS = ("ports", "ttl")
# kagent's CreateSandboxRequest fields (agent name, namespace, workspace reference): accepted so its
# controller can call as it is, not used (the policy places the sandbox).
_KAGENT_FIELDS = ("agent_name", "namespace", "workspace")


def _owner(request: web.Request, session_id: str) -> Identity:
    """The caller's identity from X-* headers, required: access is granted to a session's owner only."""
    headers = request.headers
    return parse_headers(headers.get("X-Org-Id"), headers.get("X-User-Id"), session_id, headers.get("X-Bot-Id"))


def _allowed_ports(router: SessionRouter, record: SandboxRecord) -> PortSet:
    assert record.endpoint is not None  # a ready sandbox has one
    return router.view.allowed_ports(record.pool, record.endpoint)


async def grant_access(request: web.Request) -> web.Response:
    """A sandbox access token for the session's owner (anyone else: 404), with its host and path URLs."""
    session_id = _path_session(request)
    body = await _json_object(request, _ACCESS_FIELDS, optional=True)
    router = request.app[ROUTER]
    binding = await router.lookup(session_id, _owner(request, session_id))
    record = await router.ensure_sandbox(binding)  # the current incarnation, woken or re-created if need be
    grant = request.app[GRANTS].grant(record, _allowed_ports(router, record), ports=body.get("ports"),
                                      ttl=body.get("ttl"), request_host=request.host)
    return web.json_response({"session_id": session_id, **grant.as_dict()})


async def kagent_bind(request: web.Request) -> web.Response:
    """kagent's ``POST /api/sessions/{id}/sandbox``: bind per policy (creating the sandbox), then its MCP URL."""
    session_id = _path_session(request)
    await _json_object(request, _KAGENT_FIELDS, optional=True)
    _, record = await request.app[ROUTER].bind(_owner(request, session_id))
    return web.json_response(_kagent_view(request, record))


async def kagent_status(request: web.Request) -> web.Response:
    """kagent's ``GET /api/sessions/{id}/sandbox``: the session's sandbox as it is now; creates nothing."""
    session_id = _path_session(request)
    router = request.app[ROUTER]
    record = await router.sandbox_of(await router.lookup(session_id, _owner(request, session_id)))
    if record is None:
        raise NotFound(f"session {session_id!r} has no sandbox now; POST /api/sessions/{session_id}/sandbox "
                       "creates it", code="sandbox_not_found")
    return web.json_response(_kagent_view(request, record))


def _kagent_view(request: web.Request, record: SandboxRecord) -> dict[str, Any]:
    """kagent's SandboxResponse: ``mcp_url`` is a path URL carrying an access token (so an agent given only
    the URL gets through), ``headers`` the same token as a bearer (for clients that drop cookies)."""
    view: dict[str, Any] = {"sandbox_id": record.sandbox_id, "mcp_url": "", "protocol": "streamable-http",
                            "headers": {}, "ready": record.state is SandboxState.READY}
    if record.endpoint is None:  # suspended or on its way: no port to name until it is up again
        view["ready"] = False
        return view
    target = request.app[MCP_TARGET]
    port = target.port if target.port is not None else record.endpoint.port
    grant = request.app[GRANTS].grant(record, _allowed_ports(request.app[ROUTER], record), ports=[port],
                                      request_host=request.host)
    mcp_url = grant.path_url(port, target.path)
    if mcp_url is None:
        raise NotImplementedByGateway("kagent's mcp_url is a path URL: set preview_path_prefix "
                                      "(SANDBOX_GATEWAY_PREVIEW_PATH_PREFIX), e.g. /s", code="path_urls_off")
    view.update(mcp_url=mcp_url, headers=grant.as_dict()["headers"])
    return view


LIST_DEFAULT_LIMIT = 100
LIST_MAX_LIMIT = 1000
_LIST_PARAMETERS = ("limit", "cursor", "pool", "state", "org")


async def list_sandboxes(request: web.Request) -> web.Response:
    """One page, oldest activity first; ``next_cursor`` (null at the end) fetches the next one.

    Bounded whatever the fleet size: a page examines ``limit`` index entries unfiltered, and at
    most ``FILTERED_SCAN`` with a filter, so a filtered page may be short (even empty) while
    ``next_cursor`` is not null. A sandbox used while a client pages may appear again later.
    """
    query = _single_valued(request, _LIST_PARAMETERS)
    limit = _limit(query.get("limit"))
    after = Position.decode(query["cursor"]) if "cursor" in query else None
    state = query.get("state")
    if state is not None and state not in SandboxState.__members__.values():
        raise BadRequest(f"state {state!r} is not a sandbox state (one of: {', '.join(SandboxState)})")
    pools = request.app[ROUTER].view.pools
    if "pool" in query and query["pool"] not in pools:
        raise BadRequest(f"pool {query['pool']!r} is not in the policy (pools: {', '.join(pools)})")
    where = SandboxFilter(pool=query.get("pool"), state=None if state is None else SandboxState(state),
                          org_id=query.get("org"))
    page = await request.app[ROUTER].sandboxes(after, limit=limit, where=where)
    return web.json_response({
        "sandboxes": [
            {"sandbox_id": r.sandbox_id, "pool": r.pool, "org_id": r.org_id, "state": r.state.value,
             "sessions": r.sessions, "last_activity": r.last_active, "created_at": r.created_at}
            for r in page.records],
        "next_cursor": None if page.next is None else page.next.encode(),
        "warnings": request.app[WARNINGS],
    })


def _path_sandbox(request: web.Request) -> str:
    sandbox_id = request.match_info["sandbox_id"]
    if not is_valid_sandbox_id(sandbox_id):
        raise BadRequest(f"{sandbox_id!r} is not a sandbox ID: take one from GET /v1/sandboxes")
    return sandbox_id


def _sandbox_view(record: SandboxRecord) -> dict[str, Any]:
    return {"sandbox_id": record.sandbox_id, "pool": record.pool, "state": record.state.value,
            "endpoint": record.endpoint.url() if record.endpoint is not None else None}


SUSPEND_MAX_GRACE = 3600.0
_SUSPEND_PARAMETERS = ("force", "grace")


async def suspend_sandbox(request: web.Request) -> web.Response:
    """Admin: suspend a ready sandbox (idempotent); 409 while it is being created or woken.

    It waits for the sandbox's open exchanges to end, up to ``?grace=SECONDS`` (default: the
    ``suspend_grace`` setting), then answers 409 naming them; ``?force=true`` suspends at once
    and cuts them."""
    sandbox_id = _path_sandbox(request)
    query = _single_valued(request, _SUSPEND_PARAMETERS)
    force = query.get("force", "false")
    if force not in ("true", "false"):
        raise BadRequest(f"force must be true or false (got {force[:40]!r})")
    grace = request.app[SUSPEND_GRACE]
    if "grace" in query:
        try:
            grace = float(query["grace"])
        except ValueError:
            grace = math.nan
        if not 0 <= grace <= SUSPEND_MAX_GRACE:
            raise BadRequest(f"grace must be a number of seconds from 0 to {SUSPEND_MAX_GRACE:g} "
                             f"(got {query['grace'][:40]!r})")
    record = await request.app[ROUTER].suspend_sandbox(sandbox_id, grace=None if force == "true" else grace)
    return web.json_response(_sandbox_view(record))


async def delete_sandbox(request: web.Request) -> web.Response:
    """Admin: destroy a sandbox, shared ones included (a session's DELETE only unbinds from those)."""
    record = await request.app[ROUTER].delete_sandbox(_path_sandbox(request))
    return web.json_response({**_sandbox_view(record), "deleted": True})


async def resume_sandbox(request: web.Request) -> web.Response:
    """Admin: wake a suspended sandbox and answer once it is ready (idempotent)."""
    record = await request.app[ROUTER].resume_sandbox(_path_sandbox(request))
    return web.json_response(_sandbox_view(record))


def _single_valued(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown query parameter {unknown[0]!r} (allowed: {', '.join(allowed)})")
    repeated = sorted(name for name in set(request.query) if len(request.query.getall(name)) > 1)
    if repeated:
        raise BadRequest(f"query parameter {repeated[0]!r} is given more than once")
    return dict(request.query)


def _limit(raw: str | None) -> int:
    if raw is None:
        return LIST_DEFAULT_LIMIT
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= LIST_MAX_LIMIT:
        raise BadRequest(f"limit must be a whole number from 1 to {LIST_MAX_LIMIT} (got {raw[:40]!r})")
    return int(raw)


async def route_dry_run(request: web.Request) -> web.Response:
    unknown = sorted(set(request.query) - set(_IDENTITY_FIELDS))
    if unknown:
        raise BadRequest(f"unknown query parameter {unknown[0]!r} (allowed: {', '.join(_IDENTITY_FIELDS)})")
    repeated = sorted(name for name in set(request.query) if len(request.query.getall(name)) > 1)
    if repeated:
        raise BadRequest(f"query parameter {repeated[0]!r} is given more than once", code="invalid_identity")
    placement = request.app[ROUTER].dry_run(_identity(dict(request.query)))
    return web.json_response(placement.as_dict())


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    problems = await request.app[READINESS]()
    if problems:
        return web.json_response({"status": "unavailable", "problems": problems}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": content_type})


def create_control_app(router: SessionRouter, readiness: Callable[[], Awaitable[list[str]]], metrics_: Metrics,
                       admin: AdminCheck = AllowAll(), *, warnings: list[str] | None = None,
                       grants: Grants = NoGrants(), mcp: McpTarget = McpTarget(),
                       hosts: AllowedHosts = AllowedHosts(["*"]), suspend_grace: float = 30.0) -> web.Application:
    app = web.Application(middlewares=[error_middleware, hosts_middleware, headers_middleware, admin_middleware],
                          client_max_size=64 * 1024)
    app[HOSTS] = hosts
    app[WARNINGS] = list(warnings or [])
    app[ROUTER] = router
    app[ADMIN] = admin
    app[READINESS] = readiness
    app[METRICS] = metrics_
    app[GRANTS] = grants
    app[MCP_TARGET] = mcp
    app[SUSPEND_GRACE] = suspend_grace
    app.router.add_post("/v1/sessions", create_session)
    app.router.add_get("/v1/sessions/{session_id}", get_session)
    app.router.add_delete("/v1/sessions/{session_id}", delete_session)
    app.router.add_post("/v1/sessions/{session_id}/access", grant_access)
    app.router.add_post("/api/sessions/{session_id}/sandbox", kagent_bind)
    app.router.add_get("/api/sessions/{session_id}/sandbox", kagent_status)
    app.router.add_get("/v1/sandboxes", list_sandboxes)
    app.router.add_post("/v1/sandboxes/{sandbox_id}/suspend", suspend_sandbox)
    app.router.add_post("/v1/sandboxes/{sandbox_id}/resume", resume_sandbox)
    app.router.add_delete("/v1/sandboxes/{sandbox_id}", delete_sandbox)
    app.router.add_get("/v1/route", route_dry_run)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


# -- malformed HTTP --------------------------------------------------------------------------
# Bytes that aiohttp cannot parse never reach the app or its middlewares: its RequestHandler
# answers them itself in handle_error(), as text/plain that quotes the offending bytes back
# (a reflection of whatever the client sent, and not our error shape). aiohttp has no public
# hook for that answer, so the control port runs a RequestHandler subclass (web.RequestHandler
# is exported) that overrides handle_error, created by a Server subclass, which ControlRunner
# builds in place of the app's own. tests/test_hostile_credentials.py sends raw bad bytes to a
# real serve and pins the JSON answer, so an aiohttp upgrade that moves this seam fails there.

def _protocol_error(status: int, exc: BaseException | None) -> GatewayError:
    if status == 400:
        if isinstance(exc, LineTooLong):
            return BadRequest("the request line or a header is too long", code="header_too_large")
        # Not aiohttp's message: several of them quote the request bytes back.
        return BadRequest("malformed HTTP request (a bad request line or header, a Host missing or given twice, "
                          "or bad framing); the control API takes HTTP/1.1 requests with JSON bodies")
    # Past error_middleware only for failures outside a handler (aiohttp's 500 and 504).
    error = GatewayError("internal error; the gateway logged the details")
    error.status = status  # type: ignore[misc]  # keep aiohttp's status, our body shape
    return error


class _JsonErrorHandler(web.RequestHandler):
    __slots__ = ()

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's own: logs, and raises when part of a response already left (then it closes).
        super().handle_error(request, status, exc, None)
        response = error_response(_protocol_error(status, exc))
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)  # what web.Server.__call__ does


class ControlRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer malformed HTTP in the JSON error shape."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # starts the app
        return _JsonErrorServer(server.request_handler, request_factory=server.request_factory,
                                handler_cancellation=server.handler_cancellation, loop=server._loop,
                                **server._kwargs)
