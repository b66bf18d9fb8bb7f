"""Kubernetes `Status` errors, shaped like the real apiserver's (k8s.io/apimachinery/pkg/api/errors).

ApiError
  carries the HTTP code and the full `Status` body; every constructor below mirrors the Go
  helper of the same name (NewNotFound, NewAlreadyExists, NewConflict, NewInvalid, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REASON_BY_CODE = {
    400: "BadRequest",
    401: "Unauthorized",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
}


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


@dataclass(frozen=True)
class FieldError:
    """One cause of a 422 (k8s.io/apimachinery/pkg/util/validation/field.Error)."""

    reason: str  # FieldValueRequired, FieldValueInvalid, FieldValueTypeInvalid, ...
    field: str  # "spec.podTemplate.spec.containers[0].name"
    message: str  # "Required value", "Invalid value: \"x\": ..."

    def render(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def required(field: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", field, "Required value" + (f": {detail}" if detail else ""))


def invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", field, f"Invalid value: {show(value)}: {detail}")


def type_invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueTypeInvalid", field, f"Invalid value: {show(value)}: {detail}")


def not_supported(field: str, value: Any, allowed: list[Any]) -> FieldError:
    values = ", ".join(show(v) for v in allowed)
    return FieldError("FieldValueNotSupported", field, f"Unsupported value: {show(value)}: supported values: {values}")


def too_long(field: str, limit: int) -> FieldError:
    return FieldError("FieldValueTooLong", field, f"Too long: may not be more than {limit} bytes")


def too_many(field: str, count: int, limit: int) -> FieldError:
    return FieldError("FieldValueTooMany", field, f"Too many: {count}: must have at most {limit} items")


def duplicate(field: str, value: Any) -> FieldError:
    return FieldError("FieldValueDuplicate", field, f"Duplicate value: {show(value)}")


def forbidden(field: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", field, f"Forbidden: {detail}")


def show(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    if value is None:
        return "null"
    return str(value)


class ApiError(Exception):
    """An error response: `code` is the HTTP status, `body` the `Status` object."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.body = status_body(code, reason or REASON_BY_CODE.get(code, "Unknown"), message, details)

    @property
    def reason(self) -> str:
        return self.body["reason"]

    # Constructors named after k8s.io/apimachinery/pkg/api/errors ------------------------------

    @classmethod
    def not_found(cls, group: str, plural: str, name: str) -> ApiError:
        return cls(404, f'{_qualified(group, plural)} "{name}" not found', "NotFound",
                   {"name": name, "group": group, "kind": plural})

    @classmethod
    def already_exists(cls, group: str, plural: str, name: str) -> ApiError:
        return cls(409, f'{_qualified(group, plural)} "{name}" already exists', "AlreadyExists",
                   {"name": name, "group": group, "kind": plural})

    @classmethod
    def conflict(cls, group: str, plural: str, name: str, why: str) -> ApiError:
        return cls(409, f'Operation cannot be fulfilled on {_qualified(group, plural)} "{name}": {why}', "Conflict",
                   {"name": name, "group": group, "kind": plural})

    @classmethod
    def invalid(cls, group: str, kind: str, name: str, causes: list[FieldError]) -> ApiError:
        rendered = [c.render() for c in causes]
        summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
        details = {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes],
        }
        return cls(422, f'{_qualified(group, kind)} "{name}" is invalid: {summary}', "Invalid", details)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, message, "BadRequest")

    @classmethod
    def expired(cls, message: str) -> ApiError:
        return cls(410, message, "Expired")

    @classmethod
    def unsupported_media_type(cls, content_type: str) -> ApiError:
        return cls(415, f"the body of the request was in an unknown format - accepted media types include: "
                        f"application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
                        f" (got {content_type})", "UnsupportedMediaType")


def _qualified(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource
