"""One exception tree for the whole gateway, translated to HTTP in one place.

::

    GatewayError                      500 internal (never for bad input)
    ├── BadRequest                    400 bad_request / invalid_identity / invalid_json
    ├── Unauthorized                  401 unauthorized
    ├── Forbidden                     403 forbidden
    ├── NotFound                      404 not_found
    ├── Conflict                      409 conflict
    ├── PayloadTooLarge               413 payload_too_large
    ├── UnsupportedMediaType          415 unsupported_media_type
    ├── CapacityExceeded              429 capacity_exceeded (+ Retry-After)
    ├── StoreUnavailable              503 store_unavailable (+ Retry-After)
    ├── ProvisionFailed               503 provision_failed
    │   └── ProvisionTimeout          504 provision_timeout
    └── UpstreamError                 502 upstream_error
        ├── UpstreamConnectError      502 upstream_unreachable
        └── UpstreamTimeout           504 upstream_timeout

Code that calls aiohttp, redis or kubernetes wraps their errors into these
(``raise ... from exc``) so that handlers never classify foreign exceptions,
and :func:`error_body` is the only place an error becomes a response body.
"""

from __future__ import annotations

import json
from typing import ClassVar


class GatewayError(Exception):
    """Base of every error the gateway reports to a client."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

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


class Unauthorized(GatewayError):
    status = 401
    code = "unauthorized"


class Forbidden(GatewayError):
    status = 403
    code = "forbidden"


class NotFound(GatewayError):
    status = 404
    code = "not_found"


class Conflict(GatewayError):
    status = 409
    code = "conflict"


class PayloadTooLarge(GatewayError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    code = "unsupported_media_type"


class CapacityExceeded(GatewayError):
    status = 429
    code = "capacity_exceeded"

    def __init__(self, message: str, *, scope: str, retry_after: float = 30.0) -> None:
        super().__init__(message, retry_after=retry_after)
        self.scope = scope


class StoreUnavailable(GatewayError):
    status = 503
    code = "store_unavailable"

    def __init__(self, message: str, *, retry_after: float = 5.0) -> None:
        super().__init__(message, retry_after=retry_after)


class ProvisionFailed(GatewayError):
    status = 503
    code = "provision_failed"


class ProvisionTimeout(ProvisionFailed):
    status = 504
    code = "provision_timeout"


class UpstreamError(GatewayError):
    status = 502
    code = "upstream_error"


class UpstreamConnectError(UpstreamError):
    status = 502
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


def error_body(exc: GatewayError) -> bytes:
    """The documented JSON shape; the sandbox ID is included when the error concerns one."""
    error: dict[str, str] = {"code": exc.code, "message": exc.message}
    if exc.sandbox_id:
        error["sandbox_id"] = exc.sandbox_id
    return json.dumps({"error": error}).encode()
