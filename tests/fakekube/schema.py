"""Structural-schema processing of custom resources, the way apiextensions-apiserver does it.

Two passes, in the apiserver's order:

1. `normalize()` (decode time): drop nulls of non-nullable fields, prune unknown fields (unless
   `x-kubernetes-preserve-unknown-fields`; `x-kubernetes-embedded-resource` keeps
   apiVersion/kind/metadata), apply `default`s. The pruned paths are returned so that
   `fieldValidation=Strict` can reject them and `Warn` can report them.
2. `validate()` (after the strategy prepared the object): type, required, enum, pattern,
   min/maxLength, minimum/maximum (+exclusive), min/maxItems, min/maxProperties, format
   date-time, `x-kubernetes-int-or-string`, `x-kubernetes-list-type` set/map uniqueness, anyOf,
   and the CEL rules in `KNOWN_RULES` (an unknown CEL rule is skipped: no CEL interpreter here).

ObjectMeta (`metadata` of the root and of embedded resources) is handled by
`normalize_object_meta()` / `validate_object_meta()`.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable
from typing import Any

from . import errors as E

_MISSING = object()
MISSING = _MISSING  # "no old object" (creates)

OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers", "managedFields",
})

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DATE_TIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")

# CEL rules found in the vendored CRDs, as Python predicates (self, oldSelf) -> bool.
# Transition rules (those using oldSelf) only run on updates, as in the apiserver.
KNOWN_RULES: dict[str, Callable[[Any, Any], bool]] = {
    "has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) && "
    "(!has(self.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)":
        lambda new, old: ("volumeClaimTemplates" in new) == ("volumeClaimTemplates" in old)
        and new.get("volumeClaimTemplates") == old.get("volumeClaimTemplates"),
}


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


@functools.lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# --- pass 1: prune, default, drop nulls ---------------------------------------------------------

def normalize(schema: dict[str, Any] | None, value: Any, path: str = "", unknown: list[str] | None = None,
              *, root: bool = False) -> Any:
    """A pruned and defaulted copy of `value`; pruned field paths are appended to `unknown`.

    With `root=True` the top-level `metadata` is passed through untouched (see
    `normalize_object_meta`)."""
    if unknown is None:
        unknown = []
    if schema is None:
        return copy.deepcopy(value)
    if isinstance(value, dict):
        return _normalize_object(schema, value, path, unknown, root)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [normalize(schema["items"], v, f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    if isinstance(value, float) and value.is_integer() and _is_integer_schema(schema):
        return int(value)  # JSON 1.0 decodes to int64 in the apiserver
    return copy.deepcopy(value)


def _is_integer_schema(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "integer" or bool(schema.get("x-kubernetes-int-or-string"))


def _normalize_object(schema: dict[str, Any], value: dict[str, Any], path: str, unknown: list[str],
                      root: bool) -> dict[str, Any]:
    props: dict[str, Any] = schema.get("properties") or {}
    addl = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    embedded = bool(schema.get("x-kubernetes-embedded-resource"))
    out: dict[str, Any] = {}
    for key, item in value.items():
        child = join(path, key)
        if root and key == "metadata":
            out[key] = copy.deepcopy(item)
        elif embedded and key in ("apiVersion", "kind") and key not in props:
            out[key] = item
        elif embedded and key == "metadata":
            out[key] = normalize_object_meta(item, child, unknown) if isinstance(item, dict) else item
        elif key in props:
            sub = props[key]
            if item is None and not sub.get("nullable"):
                continue  # nulls of non-nullable fields are pruned (then defaulted)
            out[key] = normalize(sub, item, child, unknown)
        elif isinstance(addl, dict):
            out[key] = normalize(addl, item, f"{path}[{key}]", unknown)
        elif preserve or addl is True:
            out[key] = copy.deepcopy(item)
        else:
            unknown.append(child)
    for key, sub in props.items():
        if key not in out and "default" in sub:
            out[key] = normalize(sub, copy.deepcopy(sub["default"]), join(path, key), [])
    return out


def normalize_object_meta(meta: dict[str, Any], path: str, unknown: list[str]) -> dict[str, Any]:
    out = {}
    for key, item in meta.items():
        if key in OBJECT_META_FIELDS:
            if item is not None:
                out[key] = copy.deepcopy(item)
        else:
            unknown.append(join(path, key))
    return out


# --- pass 2: validation -------------------------------------------------------------------------

def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(schema: dict[str, Any], value: Any) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    expected = schema.get("type")
    actual = _json_type(value)
    if value is None:
        preserved = not expected and bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        return bool(schema.get("nullable")) or preserved
    if not expected:
        return True
    if expected == "number":
        return actual in ("integer", "number")
    return expected == actual


def validate(schema: dict[str, Any] | None, value: Any, path: str = "", old: Any = _MISSING,
             *, root: bool = False) -> list[E.FieldError]:
    """Every violation of `schema` by `value` (`old` is the previous value, for transition rules)."""
    out: list[E.FieldError] = []
    if schema is not None:
        _validate(schema, value, path, old, out, root)
    return out


def _validate(schema: dict[str, Any], value: Any, path: str, old: Any, out: list[E.FieldError], root: bool) -> None:
    if not _type_ok(schema, value):
        expected = "integer or string" if schema.get("x-kubernetes-int-or-string") else schema.get("type")
        out.append(E.type_invalid(path, value, f"{path or '<root>'} in body must be of type {expected}: "
                                               f'"{_json_type(value)}"'))
        return
    if value is None:
        return
    if "enum" in schema and value not in schema["enum"]:
        out.append(E.not_supported(path, value, schema["enum"]))
    if isinstance(value, str):
        _validate_string(schema, value, path, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _validate_number(schema, value, path, out)
    elif isinstance(value, dict):
        _validate_object(schema, value, path, old, out, root)
    elif isinstance(value, list):
        _validate_array(schema, value, path, out)
    if "anyOf" in schema and not schema.get("x-kubernetes-int-or-string"):
        if all(validate(branch, value, path) for branch in schema["anyOf"]):
            out.append(E.invalid(path, value, f"{path} in body must match at least one schema in anyOf"))
    for branch in schema.get("allOf") or ():
        out.extend(validate(branch, value, path))
    _validate_rules(schema, value, path, old, out)


def _validate_string(schema: dict[str, Any], value: str, path: str, out: list[E.FieldError]) -> None:
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        out.append(E.too_long(path, schema["maxLength"]))
    if "minLength" in schema and len(value) < schema["minLength"]:
        out.append(E.invalid(path, value, f"{path} in body should be at least {schema['minLength']} chars long"))
    if "pattern" in schema and not _regex(schema["pattern"]).search(value):
        out.append(E.invalid(path, value, f"{path} in body should match '{schema['pattern']}'"))
    if schema.get("format") == "date-time" and not _DATE_TIME.match(value):
        out.append(E.invalid(path, value, f'{path} in body must be of type date-time: "{value}"'))


def _validate_number(schema: dict[str, Any], value: float, path: str, out: list[E.FieldError]) -> None:
    if "minimum" in schema:
        low = schema["minimum"]
        if value < low or (schema.get("exclusiveMinimum") and value == low):
            word = "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
            out.append(E.invalid(path, value, f"{path} in body should be {word} {low}"))
    if "maximum" in schema:
        high = schema["maximum"]
        if value > high or (schema.get("exclusiveMaximum") and value == high):
            word = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
            out.append(E.invalid(path, value, f"{path} in body should be {word} {high}"))


def _validate_object(schema: dict[str, Any], value: dict[str, Any], path: str, old: Any,
                     out: list[E.FieldError], root: bool) -> None:
    props: dict[str, Any] = schema.get("properties") or {}
    addl = schema.get("additionalProperties")
    for key in schema.get("required") or ():
        if key not in value:
            out.append(E.required(join(path, key)))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        out.append(E.too_many(path, len(value), schema["maxProperties"]))
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        out.append(E.invalid(path, len(value), f"{path} in body should have at least "
                                               f"{schema['minProperties']} properties"))
    if schema.get("x-kubernetes-embedded-resource"):
        for key in ("apiVersion", "kind"):
            if not value.get(key):
                out.append(E.required(join(path, key), "must not be empty"))
    old_map = old if isinstance(old, dict) else {}
    for key, item in value.items():
        if root and key == "metadata":
            continue
        if key in props:
            _validate(props[key], item, join(path, key), old_map.get(key, _MISSING), out, False)
        elif isinstance(addl, dict):
            _validate(addl, item, f"{path}[{key}]", old_map.get(key, _MISSING), out, False)


def _validate_array(schema: dict[str, Any], value: list[Any], path: str, out: list[E.FieldError]) -> None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        out.append(E.too_many(path, len(value), schema["maxItems"]))
    if "minItems" in schema and len(value) < schema["minItems"]:
        out.append(E.invalid(path, len(value), f"{path} in body should have at least {schema['minItems']} items"))
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            _validate(items, item, f"{path}[{i}]", _MISSING, out, False)
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set" or schema.get("uniqueItems"):
        seen: set[str] = set()
        for i, item in enumerate(value):
            key = json.dumps(item, sort_keys=True)
            if key in seen:
                out.append(E.duplicate(f"{path}[{i}]", item))
            seen.add(key)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen_keys: set[str] = set()
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            ident = {k: item.get(k) for k in keys}
            key = json.dumps(ident, sort_keys=True)
            if key in seen_keys:
                out.append(E.duplicate(f"{path}[{i}]", ident))
            seen_keys.add(key)


def _validate_rules(schema: dict[str, Any], value: Any, path: str, old: Any, out: list[E.FieldError]) -> None:
    for rule in schema.get("x-kubernetes-validations") or ():
        check = KNOWN_RULES.get(" ".join(rule["rule"].split()))
        if check is None:
            continue
        if "oldSelf" in rule["rule"] and old is _MISSING:
            continue
        if not check(value, old if old is not _MISSING else None):
            message = rule.get("message") or f"failed rule: {rule['rule']}"
            field = join(path, rule["fieldPath"].lstrip(".")) if rule.get("fieldPath") else path
            out.append(E.FieldError(rule.get("reason", "FieldValueInvalid"), field,
                                    f"Invalid value: {E.show(value)}: {message}"))


# --- ObjectMeta ---------------------------------------------------------------------------------

def _qualified_name_errors(field: str, key: str) -> list[E.FieldError]:
    prefix, _, name = key.rpartition("/")
    errs = []
    if "/" in key and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        errs.append(E.invalid(field, key, "prefix part must be a lowercase RFC 1123 subdomain"))
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        errs.append(E.invalid(field, key, "name part must consist of alphanumeric characters, '-', '_' or '.', "
                                          "and must start and end with an alphanumeric character, "
                                          "and be no more than 63 characters"))
    return errs


def validate_name(field: str, name: str, rule: str = "subdomain") -> list[E.FieldError]:
    if rule == "label":
        if len(name) > 63:
            return [E.invalid(field, name, "must be no more than 63 characters")]
        if not DNS1123_LABEL.match(name):
            return [E.invalid(field, name, "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                                           "characters or '-', and must start and end with an alphanumeric "
                                           "character (e.g. 'my-name',  or '123-abc', regex used for validation "
                                           "is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")]
        return []
    if len(name) > 253:
        return [E.invalid(field, name, "must be no more than 253 characters")]
    if not DNS1123_SUBDOMAIN.match(name):
        return [E.invalid(field, name, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                                       "characters, '-' or '.', and must start and end with an alphanumeric "
                                       "character (e.g. 'example.com', regex used for validation is "
                                       "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")]
    return []


def validate_object_meta(meta: Any, path: str = "metadata", *, name_rule: str = "subdomain") -> list[E.FieldError]:
    if not isinstance(meta, dict):
        return [E.type_invalid(path, meta, f"{path} in body must be of type object")]
    out: list[E.FieldError] = []
    name = meta.get("name")
    if not name:
        out.append(E.required(join(path, "name"), "name or generateName is required"))
    elif not isinstance(name, str):
        out.append(E.type_invalid(join(path, "name"), name, "must be a string"))
    else:
        out.extend(validate_name(join(path, "name"), name, name_rule))
    for field in ("labels", "annotations"):
        value = meta.get(field, {})
        if not isinstance(value, dict):
            out.append(E.type_invalid(join(path, field), value, f"{join(path, field)} must be a map of strings"))
            continue
        for key, item in value.items():
            out.extend(_qualified_name_errors(join(path, field), key))
            if not isinstance(item, str):
                out.append(E.type_invalid(join(path, field), item, "values must be strings"))
            elif field == "labels" and (len(item) > 63 or not _LABEL_VALUE.match(item)):
                out.append(E.invalid(join(path, field), item, "a valid label must be an empty string or consist of "
                                                              "alphanumeric characters, '-', '_' or '.', and must "
                                                              "start and end with an alphanumeric character, and be "
                                                              "no more than 63 characters"))
        if field == "annotations" and sum(len(k) + len(str(v)) for k, v in value.items()) > 262144:
            out.append(E.too_long(join(path, field), 262144))
    for i, ref in enumerate(meta.get("ownerReferences") or ()):
        ref_path = f"{join(path, 'ownerReferences')}[{i}]"
        for key in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(ref, dict) or not ref.get(key):
                out.append(E.required(join(ref_path, key)))
    controllers = [r for r in meta.get("ownerReferences") or () if isinstance(r, dict) and r.get("controller")]
    if len(controllers) > 1:
        out.append(E.invalid(join(path, "ownerReferences"), "array",
                             "Only one reference can have Controller set to true"))
    for i, fin in enumerate(meta.get("finalizers") or ()):
        if not isinstance(fin, str) or ("/" not in fin and fin not in ("orphan", "foregroundDeletion")):
            out.append(E.invalid(f"{join(path, 'finalizers')}[{i}]", fin,
                                 "name is neither a standard finalizer name nor is it fully qualified"))
    return out
