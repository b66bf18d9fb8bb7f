"""The two patch formats the apiserver accepts for custom resources.

- JSON merge patch (RFC 7386), `application/merge-patch+json`.
- JSON patch (RFC 6902), `application/json-patch+json`: add, remove, replace, move, copy, test.

Strategic merge patch is not supported for custom resources (415), exactly like the apiserver.
Errors: an undecodable patch is 400 BadRequest; a patch that does not apply is 422, as in
k8s.io/apiserver/pkg/endpoints/handlers/patch.go.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .errors import ApiError

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"invalid JSON pointer {pointer!r}")
    return [_unescape(t) for t in pointer[1:].split("/")]


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise ValueError(f"doc is missing path: /{'/'.join(tokens)}")
    return node


def _get(doc: Any, pointer: str) -> Any:
    tokens = _split(pointer)
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise ValueError(f"doc is missing path: {pointer}")


def _remove(doc: Any, pointer: str) -> Any:
    tokens = _split(pointer)
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise ValueError(f"unable to remove nonexistent key: {last}: missing value")


def _add(doc: Any, pointer: str, value: Any, replace: bool = False) -> Any:
    tokens = _split(pointer)
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise ValueError(f"replace operation does not apply: doc is missing key: {pointer}")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise ValueError(f"add operation does not apply: doc is missing path: {pointer}")
    else:
        raise ValueError(f"doc is missing path: {pointer}")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list) or not all(isinstance(op, dict) for op in operations):
        raise ApiError.bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for op in operations:
        kind, path = op.get("op"), op.get("path")
        try:
            if not isinstance(path, str):
                raise ValueError(f"operation missing path: {op}")
            if kind == "add":
                doc = _add(doc, path, copy.deepcopy(op.get("value")))
            elif kind == "remove":
                _remove(doc, path)
            elif kind == "replace":
                doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
            elif kind in ("move", "copy"):
                value = _remove(doc, op["from"]) if kind == "move" else copy.deepcopy(_get(doc, op["from"]))
                doc = _add(doc, path, value)
            elif kind == "test":
                if _get(doc, path) != op.get("value"):
                    raise ValueError(f"testing value {path} failed: test failed")
            else:
                raise ApiError.bad_request(f"Unexpected kind: {kind}")
        except (ValueError, KeyError) as exc:
            raise ApiError(422, str(exc), "Invalid") from exc
    return doc


def check_patch_type(content_type: str) -> str:
    """The patch media type, or ApiError 415 (strategic merge patch is never accepted for custom
    resources; server-side apply is real but not implemented by this fake)."""
    media = content_type.split(";")[0].strip().lower()
    if media == APPLY_PATCH:
        raise ApiError(415, "server-side apply (application/apply-patch+yaml) is not implemented by the fake "
                            "apiserver", "UnsupportedMediaType")
    if media not in (MERGE_PATCH, JSON_PATCH):
        raise ApiError.unsupported_media_type(media)
    return media


def apply_patch(current: dict[str, Any], raw: bytes, content_type: str) -> Any:
    """`current` patched by the request body `raw` of media type `content_type`."""
    media = check_patch_type(content_type)
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        raise ApiError.bad_request(f"error decoding patch: {exc}") from exc
    if media == JSON_PATCH:
        return json_patch(current, body)
    if not isinstance(body, dict):
        raise ApiError.bad_request("json: cannot unmarshal array into Go value of type map[string]interface {}")
    return merge_patch(current, body)
