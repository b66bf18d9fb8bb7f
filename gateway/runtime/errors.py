"""The runtime's exception tree, translated to HTTP in exactly one place.

Handlers raise these; :func:`gateway.runtime.server.error_middleware` turns
them into the contract's JSON error body. Nothing else builds error bodies, so
every failure a client can see has the same shape::

    RuntimeApiError                 (500 internal_error)
     ├── BadRequest                 (400 bad_request, or a more specific code)
     ├── PathOutsideRoot            (403 path_outside_root)
     ├── PermissionDenied           (403 permission_denied)
     ├── NotFound                   (404 not_found)
     └── TooLarge                   (413 too_large, or a more specific code)

The runtime is its own process speaking the agent-sandbox API, so it keeps its
own small tree instead of importing the gateway's: a sandbox must not depend
on the service that routes to it.
"""

from __future__ import annotations

from typing import ClassVar


class RuntimeApiError(Exception):
    """Base of every error a runtime handler raises on purpose.

    ``code`` is a stable snake_case identifier for programs; ``message`` says
    what was wrong and how to fix it, for humans.
    """

    status: ClassVar[int] = 500
    default_code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code


class BadRequest(RuntimeApiError):
    """The request itself is malformed: bad JSON, wrong types, bad paths."""

    status = 400
    default_code = "bad_request"


class PathOutsideRoot(RuntimeApiError):
    """A path resolved (after ``..`` and symlinks) to somewhere outside root."""

    status = 403
    default_code = "path_outside_root"


class PermissionDenied(RuntimeApiError):
    """The path is inside root but the runtime's user may not touch it."""

    status = 403
    default_code = "permission_denied"


class NotFound(RuntimeApiError):
    """The path is inside root but nothing is there."""

    status = 404
    default_code = "not_found"


class TooLarge(RuntimeApiError):
    """The request is larger than the runtime can take (a command past the kernel's argument limit)."""

    status = 413
    default_code = "too_large"
