"""One exception tree for the whole gateway, translated to HTTP in one place.

::

    GatewayError                      500 internal                     gRPC INTERNAL
    ├── BadRequest                    400 bad_request / invalid_identity    INVALID_ARGUMENT
    ├── Unauthorized                  401 unauthorized                      UNAUTHENTICATED
    ├── Forbidden                     403 forbidden                         PERMISSION_DENIED
    ├── NotFound                      404 not_found                         NOT_FOUND
    ├── RequestTimeout                408 request_body_timeout              DEADLINE_EXCEEDED
    ├── Conflict                      409 conflict                          ABORTED
    ├── PayloadTooLarge               413 payload_too_large                 RESOURCE_EXHAUSTED
    ├── UriTooLong                    414 uri_too_long                      RESOURCE_EXHAUSTED
    ├── UnsupportedMediaType          415 unsupported_media_type            INVALID_ARGUMENT
    ├── MisdirectedRequest            421 host_not_allowed                  INVALID_ARGUMENT
    ├── CapacityExceeded              429 capacity_exceeded (+ Retry-After) RESOURCE_EXHAUSTED (+ retry-after)
    ├── HeaderTooLarge                431 header_too_large                  RESOURCE_EXHAUSTED
    ├── NotImplementedByGateway       501 not_implemented                   UNIMPLEMENTED
    ├── StoreUnavailable              503 store_unavailable (+ Retry-After) UNAVAILABLE (+ retry-after)
    ├── InsufficientStorage           507 insufficient_storage (+ Retry-After) RESOURCE_EXHAUSTED (a disk floor)
    ├── TooManyConnections            503 too_many_connections (+ Retry-After) UNAVAILABLE (the gRPC front: GOAWAY)
    ├── ProvisionFailed               503 provision_failed                  UNAVAILABLE
    │   ├── ProvisionTimeout          504 provision_timeout                 UNAVAILABLE (retry: it is still coming)
    │   └── KubeApiError              503 provision_failed                  UNAVAILABLE (a Kubernetes API call failed)
    ├── WakeTimeout                   503 wake_timeout (+ Retry-After)      UNAVAILABLE (+ retry-after)
    └── UpstreamError                 502 upstream_error                    UNAVAILABLE
        ├── UpstreamConnectError      502 upstream_unreachable              UNAVAILABLE
        └── UpstreamTimeout           504 upstream_timeout                  DEADLINE_EXCEEDED

``KubeApiError``'s own subclasses, ``ObjectMissing`` (404), ``ObjectExists`` (409) and
``WatchExpired`` (410), are the Kubernetes provider's control flow, raised and caught inside
``gateway.providers`` (``kubernetes_api``); one that escaped would answer as ``KubeApiError``.

Code that calls aiohttp, redis or kubernetes wraps their errors into these
(``raise ... from exc``) so that handlers never classify foreign exceptions,
and :func:`render` is the only place an error becomes a response body: the
JSON shape for programs, the same status, code and message as a small HTML
page for a browser's navigation (:func:`wants_html`), so a preview URL that
fails shows a page rather than raw JSON.
The gRPC front (``gateway.grpcfront``) reads ``grpc_status`` beside ``status``:
one tree, two wire mappings, both in the table above.
"""

from __future__ import annotations

import html
import json
from typing import ClassVar

from grpclib.const import Status


class GatewayError(Exception):
    """Base of every error the gateway reports to a client."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"
    grpc_status: ClassVar[Status] = Status.INTERNAL

    def __init__(self, message: str, *, code: str | None = None, retry_after: float | None = None,
                 sandbox_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code  # type: ignore[misc]  # per-instance refinement of the class code
        self.retry_after = retry_after
        self.sandbox_id = sandbox_id

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after)))}


class BadRequest(GatewayError):
    status = 400
    code = "bad_request"
    grpc_status = Status.INVALID_ARGUMENT


class Unauthorized(GatewayError):
    status = 401
    code = "unauthorized"
    grpc_status = Status.UNAUTHENTICATED


class Forbidden(GatewayError):
    status = 403
    code = "forbidden"
    grpc_status = Status.PERMISSION_DENIED


class NotFound(GatewayError):
    status = 404
    code = "not_found"
    grpc_status = Status.NOT_FOUND


class RequestTimeout(GatewayError):
    """The client stopped sending its request (the sandbox is not at fault: not an UpstreamTimeout)."""

    status = 408
    code = "request_body_timeout"
    grpc_status = Status.DEADLINE_EXCEEDED


class Conflict(GatewayError):
    status = 409
    code = "conflict"
    grpc_status = Status.ABORTED


class PayloadTooLarge(GatewayError):
    status = 413
    code = "payload_too_large"
    grpc_status = Status.RESOURCE_EXHAUSTED


class UriTooLong(GatewayError):
    status = 414
    code = "uri_too_long"
    grpc_status = Status.RESOURCE_EXHAUSTED


class UnsupportedMediaType(GatewayError):
    status = 415
    code = "unsupported_media_type"
    grpc_status = Status.INVALID_ARGUMENT


class MisdirectedRequest(GatewayError):
    """A ``Host`` this gateway does not answer for (``allowed_hosts``, gateway/hosts.py)."""

    status = 421
    code = "host_not_allowed"
    grpc_status = Status.INVALID_ARGUMENT


class CapacityExceeded(GatewayError):
    status = 429
    code = "capacity_exceeded"
    grpc_status = Status.RESOURCE_EXHAUSTED

    def __init__(self, message: str, *, scope: str, retry_after: float = 30.0) -> None:
        super().__init__(message, retry_after=retry_after)
        self.scope = scope


class HeaderTooLarge(GatewayError):
    status = 431
    code = "header_too_large"
    grpc_status = Status.RESOURCE_EXHAUSTED


class NotImplementedByGateway(GatewayError):
    """A valid request the gateway does not carry (a transfer coding other than chunked)."""

    status = 501
    code = "not_implemented"
    grpc_status = Status.UNIMPLEMENTED


class StoreUnavailable(GatewayError):
    status = 503
    code = "store_unavailable"
    grpc_status = Status.UNAVAILABLE

    def __init__(self, message: str, *, retry_after: float = 5.0) -> None:
        super().__init__(message, retry_after=retry_after)


class InsufficientStorage(GatewayError):
    """The local provider's data dir is below its free-space floor: no new sandbox until space is freed."""

    status = 507
    code = "insufficient_storage"
    grpc_status = Status.RESOURCE_EXHAUSTED

    def __init__(self, message: str, *, retry_after: float = 60.0, sandbox_id: str | None = None) -> None:
        super().__init__(message, retry_after=retry_after, sandbox_id=sandbox_id)


class TooManyConnections(GatewayError):
    """A listener holds as many connections as it may (gateway/gate.py): the new one is answered and closed."""

    status = 503
    code = "too_many_connections"
    grpc_status = Status.UNAVAILABLE

    def __init__(self, message: str, *, retry_after: float = 5.0) -> None:
        super().__init__(message, retry_after=retry_after)


class ProvisionFailed(GatewayError):
    status = 503
    code = "provision_failed"
    grpc_status = Status.UNAVAILABLE


class ProvisionTimeout(ProvisionFailed):
    status = 504
    code = "provision_timeout"
    grpc_status = Status.UNAVAILABLE


class KubeApiError(ProvisionFailed):
    """A Kubernetes API call failed: 503 ``provision_failed`` like any provider failure. The
    statuses the provider acts on have their own classes, so no caller looks at a status code
    (``ObjectMissing`` and the others in ``gateway.providers.kubernetes_api``, which ``translated`` raises)."""

    grpc_status = Status.UNAVAILABLE


class WakeTimeout(GatewayError):
    """A suspended sandbox was not awake within its pool's ``wake_timeout``; the wake goes on, so
    the client retries after ``Retry-After``."""

    status = 503
    code = "wake_timeout"
    grpc_status = Status.UNAVAILABLE

    def __init__(self, message: str, *, sandbox_id: str | None = None, retry_after: float = 5.0) -> None:
        super().__init__(message, retry_after=retry_after, sandbox_id=sandbox_id)


class UpstreamError(GatewayError):
    status = 502
    code = "upstream_error"
    grpc_status = Status.UNAVAILABLE


class UpstreamConnectError(UpstreamError):
    status = 502
    code = "upstream_unreachable"
    grpc_status = Status.UNAVAILABLE


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    grpc_status = Status.DEADLINE_EXCEEDED


def error_body(exc: GatewayError) -> bytes:
    """The documented JSON shape; the sandbox ID is included when the error concerns one."""
    error: dict[str, str] = {"code": exc.code, "message": exc.message}
    if exc.sandbox_id:
        error["sandbox_id"] = exc.sandbox_id
    return json.dumps({"error": error}).encode()


def wants_html(fetch_mode: str | bytes | None, accept: str | bytes | None) -> bool:
    """A browser navigation: ``Sec-Fetch-Mode: navigate``, or an ``Accept`` that names ``text/html``
    and no JSON (what browsers send on a top-level load without Fetch Metadata). ``fetch()``, SDKs and
    curl get JSON: they send ``cors``/``no-cors``, ``*/*``, ``application/json`` or nothing."""
    if isinstance(fetch_mode, bytes):
        fetch_mode = fetch_mode.decode("latin-1")
    if fetch_mode is not None and fetch_mode.strip().lower() == "navigate":
        return True
    if isinstance(accept, bytes):
        accept = accept.decode("latin-1")
    if not accept:
        return False
    accept = accept.lower()
    return "text/html" in accept and "json" not in accept


# Everything interpolated is escaped (messages quote what a client sent); the headers that go with
# it (HTML_HEADERS) forbid scripts, styles from elsewhere and sniffing all the same.
_PAGE = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{status} {code}</title>"
         "<meta name=\"viewport\" content=\"width=device-width\"></head>\n"
         "<body style=\"font-family:sans-serif;max-width:40em;margin:3em auto;padding:0 1em\">"
         "<h1>{status} {code}</h1>\n<p>{message}</p>\n{sandbox}</body></html>\n")
HTML_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
                "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


def error_html(exc: GatewayError) -> bytes:
    """The same status, code and message as :func:`error_body`, as a page a browser shows."""
    sandbox = f"<p>sandbox: <code>{html.escape(exc.sandbox_id)}</code></p>\n" if exc.sandbox_id else ""
    return _PAGE.format(status=exc.status, code=html.escape(exc.code), message=html.escape(exc.message),
                        sandbox=sandbox).encode()


def render(exc: GatewayError, *, as_html: bool = False) -> tuple[str, bytes, dict[str, str]]:
    """``(content type, body, headers)`` for ``exc``: the one rendering of an error, both planes."""
    if as_html:
        return "text/html; charset=utf-8", error_html(exc), {**exc.headers(), **HTML_HEADERS}
    return "application/json", error_body(exc), exc.headers()
