"""Label and field selectors (k8s.io/apimachinery/pkg/labels and pkg/fields), parsed from the
query string of list and watch requests.

Label selector grammar: requirements joined by `,`; each one of `key`, `!key`, `key=value`,
`key==value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`, `key>N`, `key<N`.
Field selectors for custom resources: `metadata.name` and `metadata.namespace` with `=`, `==`,
`!=` (anything else is "field label not supported", as for a CRD without selectableFields).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SET_OP = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)$")
_CMP_OP = re.compile(r"^(?P<key>[^=!<>\s]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<value>.*)$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # exists, !exists, =, !=, in, notin, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present:
            return False
        try:
            number = int(value)  # type: ignore[arg-type]
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _bad(selector: str, why: str) -> ApiError:
    return ApiError.bad_request(f"unable to parse requirement: {why} (selector {selector!r})")


def _check_key(selector: str, key: str) -> str:
    if len(key.rpartition("/")[2]) > 63 or not _KEY.match(key):
        raise _bad(selector, f'Invalid value: "{key}": name part must consist of alphanumeric characters, '
                             "'-', '_' or '.', and must start and end with an alphanumeric character")
    return key


def _check_value(selector: str, value: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise _bad(selector, f'Invalid value: "{value}": a valid label must be an empty string or consist of '
                             "alphanumeric characters, '-', '_' or '.'")
    return value


def parse_label_selector(selector: str | None) -> list[Requirement]:
    """Requirements of a label selector; ApiError 400 if it does not parse."""
    if not selector or not selector.strip():
        return []
    out = []
    for part in _split_top_level(selector.strip()):
        if not part:
            raise _bad(selector, "found '', expected: identifier")
        if m := _SET_OP.match(part):
            values = tuple(_check_value(selector, v.strip()) for v in m["values"].split(","))
            out.append(Requirement(_check_key(selector, m["key"]), m["op"], values))
        elif part.startswith("!"):
            out.append(Requirement(_check_key(selector, part[1:].strip()), "!exists"))
        elif m := _CMP_OP.match(part):
            op = {"==": "=", ">": "gt", "<": "lt"}.get(m["op"], m["op"])
            value = m["value"].strip()
            if op in ("gt", "lt") and not re.fullmatch(r"-?\d+", value):
                raise _bad(selector, f"for 'gt', 'lt' operators, the value must be an integer: {value!r}")
            out.append(Requirement(_check_key(selector, m["key"]), op, (_check_value(selector, value),)))
        else:
            out.append(Requirement(_check_key(selector, part), "exists"))
    return out


FIELD_GETTERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "metadata.name": lambda obj: obj.get("metadata", {}).get("name", ""),
    "metadata.namespace": lambda obj: obj.get("metadata", {}).get("namespace", ""),
}


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    op: str  # "=" or "!="
    value: str

    def matches(self, obj: dict[str, Any]) -> bool:
        actual = FIELD_GETTERS[self.field](obj)
        return (actual == self.value) == (self.op == "=")


def parse_field_selector(selector: str | None, extra_fields: frozenset[str] = frozenset()) -> list[FieldRequirement]:
    if not selector or not selector.strip():
        return []
    out = []
    for part in selector.split(","):
        m = re.fullmatch(r"\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*", part)
        if not m:
            raise ApiError.bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")
        field, op, value = m.group(1), m.group(2), m.group(3)
        if field not in FIELD_GETTERS and field not in extra_fields:
            raise ApiError.bad_request(f'field label not supported: {field}')
        out.append(FieldRequirement(field, "!=" if op == "!=" else "=", value))
    return out


@dataclass(frozen=True)
class Selector:
    labels: tuple[Requirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, label_selector: str | None, field_selector: str | None) -> Selector:
        return cls(tuple(parse_label_selector(label_selector)), tuple(parse_field_selector(field_selector)))

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in self.labels) and all(f.matches(obj) for f in self.fields)
