"""The routing policy: pools, per-session orgs, prefix -> pool, per-org overrides.

One YAML document (see ``examples/policy.yaml``), validated strictly: unknown
keys are errors, every error names the source file and the field path, and
cross-references (a prefix or org naming a pool that does not exist) are
checked too. Parsing is pure: callers read the file and pass its text, so this
module stays free of I/O and can be used by the CLI, the gateway and tests
alike.

Without a file, :func:`default_policy` serves: two local pools, ``small`` for
per-session (``ses-``) sandboxes and ``shared`` for everything else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator,
)

from routing.ids import WILDCARD
from routing.ports import PortSet

PREFIX_KEYS = ("ses", "org", "usr", "bot", "ubt", "default")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


# A provider's check of its own section of a pool (``pools.<name>.<provider>``): the errors as
# (field path inside the section, message) pairs, empty when the section is valid.
OptionsCheck = Callable[[Mapping[str, Any]], list[tuple[str, str]]]


class PolicyError(ValueError):
    """The policy is invalid; ``errors`` holds one ``source: path: message`` line each."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def parse_duration(value: Any) -> float:
    """``90``, ``"90s"``, ``"10m"``, ``"1.5h"`` -> seconds. Booleans are rejected."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 30s, 10m or 1h")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise ValueError("must be a duration such as 30s, 10m or 1h")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("must be a positive, finite duration")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


class Isolation(StrEnum):
    """How sandboxes are shared: one per session, or one per org/user/bot."""

    PER_SESSION = "per_session"
    SHARED = "shared"


class LocalPoolOptions(BaseModel):
    """How a local pool's sandboxes run (gateway/providers/local.py, confine.py).

    ``network``: ``none`` (the default) gives each sandbox a network namespace with loopback only;
    ``outbound`` adds user-mode networking (slirp4netns) to addresses off the host: never the
    host's own addresses (its loopback and the gateway's ports included), link-local addresses
    or another sandbox. See SECURITY.md for what outbound exposes.
    """

    # As strict as _Strict (declared before it). Provider sections are the provider's to check
    # (``kubernetes`` moves to gateway/); this one can follow with a local option check.
    model_config = ConfigDict(extra="forbid", frozen=True)

    network: Literal["none", "outbound"] = "none"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolSpec(_Strict):
    """One pool of sandboxes and the provider that creates them."""

    provider: Literal["local", "static", "kubernetes"] = "local"
    max_sandboxes: int | None = Field(default=None, ge=1)
    local: LocalPoolOptions | None = None  # provider 'local' only
    idle_timeout: Duration = 1800.0
    # What an idle sandbox becomes: deleted (files and all), or suspended (no compute, files kept)
    # and woken by its next request, held up to wake_timeout; a suspended one is deleted after retention.
    on_idle: Literal["delete", "suspend"] = "delete"
    retention: Duration = 43_200.0
    wake_timeout: Duration = 60.0
    provisioning_timeout: Duration = 120.0
    # Seconds from forwarding a request to its response head; None (the default): no cap. A client
    # may ask for less with X-Sandbox-Timeout, never more.
    request_timeout: Duration | None = None
    upstreams: list[str] | None = None
    # Where the provider puts this pool's sandboxes, in its own terms: routing decides nothing from it,
    # so the provider validates it (parse_policy's ``option_checks``; gateway/providers/kubernetes_options.py).
    kubernetes: dict[str, Any] | None = None
    # Where the pool's sandboxes answer gRPC (the gRPC front forwards there, on the sandbox's host).
    grpc_port: int = Field(default=50051, ge=1, le=65535)
    # Which ports of its sandboxes the data plane may reach (host and path keys, access tokens):
    # ports and "low-high" ranges, on the provider's own host; None = the runtime port alone.
    ports: list[int | str] | None = None

    @field_validator("ports")
    @classmethod
    def _ports_parse(cls, value: list[int | str] | None) -> list[int | str] | None:
        if value is not None:
            PortSet.parse(value)  # a ValueError names the bad entry
        return value

    @property
    def port_set(self) -> PortSet | None:
        """``ports`` as a PortSet; None when the pool lists none (the runtime port alone)."""
        return PortSet.parse(self.ports) if self.ports is not None else None

    @model_validator(mode="after")
    def _provider_fields(self) -> PoolSpec:
        if self.provider == "static":
            if not self.upstreams:
                raise ValueError("provider 'static' needs a non-empty upstreams list")
            bad = [u for u in self.upstreams if not re.match(r"^https?://[^/\s]+", u)]
            if bad:
                raise ValueError(f"upstreams must be http(s) base URLs, got {bad[0]!r}")
            if len(set(self.upstreams)) != len(self.upstreams):
                raise ValueError("upstreams must be distinct")
        elif self.upstreams is not None:
            raise ValueError(f"upstreams only applies to provider 'static', not {self.provider!r}")
        if self.provider == "kubernetes" and self.kubernetes is None:
            raise ValueError("provider 'kubernetes' needs a kubernetes section")
        if self.provider != "kubernetes" and self.kubernetes is not None:
            raise ValueError(f"kubernetes only applies to provider 'kubernetes', not {self.provider!r}")
        if self.provider != "local" and self.local is not None:
            raise ValueError(f"local only applies to provider 'local', not {self.provider!r}")
        if self.provider == "static" and self.on_idle == "suspend":
            raise ValueError("on_idle: suspend is not supported by provider 'static' (its hosts are not the "
                             "gateway's to stop): set on_idle: delete or leave it out")
        if self.provider == "local" and self.ports is not None:
            raise ValueError("ports does not apply to provider 'local': a local sandbox answers on its Unix socket "
                             "alone (its own network namespace), so only its runtime port can be reached")
        return self

    @property
    def network(self) -> str:
        """A local pool's network (``none`` or ``outbound``); ``none`` for other providers."""
        return self.local.network if self.local is not None else "none"

    def sandbox_outlives_activity(self) -> tuple[float, str]:
        """How long an idle sandbox of this pool may live, and the fields that say so.

        ``idle_timeout``, plus ``retention`` where idle sandboxes are suspended (and kept that long).
        """
        if self.on_idle == "suspend":
            return self.idle_timeout + self.retention, "idle_timeout + retention"
        return self.idle_timeout, "idle_timeout"


# Validation context key: parse_policy has checked the prefix keys on the raw mapping.
_PREFIX_KEYS_CHECKED = "prefix_keys_checked"


class RoutingRules(_Strict):
    per_session_orgs: list[str] = Field(default_factory=list)
    prefix_pools: dict[str, str] = Field(default_factory=lambda: {"ses": "small", "default": "shared"})

    @model_validator(mode="after")
    def _prefix_keys(self, info: ValidationInfo) -> RoutingRules:
        # parse_policy checks the raw mapping itself (with the field errors, all at once) and
        # says so in the context; a model built any other way is checked here.
        if info.context and info.context.get(_PREFIX_KEYS_CHECKED):
            return self
        if errors := _prefix_key_errors(self.prefix_pools):
            raise ValueError("; ".join(errors))
        return self


def _prefix_key_errors(prefix_pools: Mapping[Any, Any]) -> list[str]:
    """Every unknown prefix and a missing ``default``, one ``path: message`` each.

    Works on the raw mapping too: keys that are not strings are left to the schema's errors.
    """
    allowed = ", ".join(PREFIX_KEYS)
    errors = [f"routing.prefix_pools.{key}: unknown prefix {key!r} (allowed: {allowed})"
              for key in prefix_pools if isinstance(key, str) and key not in PREFIX_KEYS]
    if "default" not in prefix_pools:
        errors.append("routing.prefix_pools: needs a 'default' entry (the pool for every prefix not listed)")
    return errors


class OrgRule(_Strict):
    """Per-org overrides: forced isolation, a pool, a sandbox cap."""

    isolation: Isolation | None = None
    pool: str | None = None
    max_sandboxes: int | None = Field(default=None, ge=1)


class PolicyDocument(_Strict):
    """The YAML document as written; :class:`Policy` is what routing uses."""

    pools: dict[str, PoolSpec]
    routing: RoutingRules = Field(default_factory=RoutingRules)
    orgs: dict[str, OrgRule] = Field(default_factory=dict)


class Policy:
    """A validated policy, with the lookups placement needs precomputed."""

    __slots__ = ("default_pool", "document", "orgs", "per_session_orgs", "pools", "prefix_pools", "source")

    def __init__(self, document: PolicyDocument, source: str, extra_per_session_orgs: Iterable[str] = ()) -> None:
        if isinstance(extra_per_session_orgs, str):
            raise TypeError("extra_per_session_orgs takes org IDs; split a raw list with parse_org_list()")
        self.document = document
        self.source = source
        self.pools: Mapping[str, PoolSpec] = document.pools
        self.orgs: Mapping[str, OrgRule] = document.orgs
        self.prefix_pools: Mapping[str, str] = document.routing.prefix_pools
        self.default_pool: str = document.routing.prefix_pools["default"]
        listed = {o.strip() for o in document.routing.per_session_orgs if o.strip()}
        self.per_session_orgs: frozenset[str] = frozenset(listed | set(extra_per_session_orgs))

    def check_session_ttl(self, session_ttl: float, setting: str = "session_ttl") -> None:
        """Refuse a ``session_ttl`` under which a binding can expire while its sandbox lives.

        A sandbox keeps its owner, so a lost binding never hands it to another tenant; but its
        owner then gets it back only by binding again, and another tenant who binds the same
        session first gets 404 instead of a sandbox. Bindings must outlive idle sandboxes.
        """
        errors = []
        for name, pool in self.pools.items():
            lifetime, fields = pool.sandbox_outlives_activity()
            if session_ttl < lifetime:
                errors.append(
                    f"{self.source}: pools.{name}.{fields}: {lifetime:g}s is longer than {setting} ({session_ttl:g}s):"
                    f" a session's binding would expire while its sandbox still runs; raise {setting} to at least"
                    f" {lifetime:g}s or lower pools.{name}.{fields}")
        if errors:
            raise PolicyError(errors)

    def summary(self) -> str:
        """A few human lines: what an operator checks after editing the file."""
        lines = [f"policy {self.source}: {len(self.pools)} pool(s)"]
        for name, pool in self.pools.items():
            cap = pool.max_sandboxes if pool.max_sandboxes is not None else "unlimited"
            network = f" network={pool.network}" if pool.provider == "local" else ""
            idle = f" on_idle=suspend retention={pool.retention:g}s" if pool.on_idle == "suspend" else ""
            lines.append(f"  pool {name}: provider={pool.provider} max_sandboxes={cap} idle_timeout={pool.idle_timeout:g}s"
                         f"{idle}{network}")
        orgs = ", ".join(sorted(self.per_session_orgs)) or "(none)"
        lines.append(f"  per-session orgs: {orgs}")
        lines.append("  prefix pools: " + ", ".join(f"{k}->{v}" for k, v in self.prefix_pools.items()))
        lines.append(f"  org overrides: {len(self.orgs)}")
        return "\n".join(lines)


def _cross_references(raw: Mapping[str, Any]) -> list[str]:
    """Routing-level checks on the raw mapping: prefix keys and pool references. Here, not
    in the models, so they are reported even when other fields fail validation (every
    error at once). Shapes the schema rejects are skipped here: the schema errors already
    name them."""
    pools = raw.get("pools")
    errors = []
    routing = raw.get("routing", {})
    prefix_pools = routing.get("prefix_pools", RoutingRules().prefix_pools) if isinstance(routing, dict) else None
    if isinstance(prefix_pools, dict):
        errors += _prefix_key_errors(prefix_pools)
        for prefix, pool in prefix_pools.items():
            if isinstance(pool, str) and isinstance(pools, dict) and pool not in pools:
                errors.append(f"routing.prefix_pools.{prefix}: pool {pool!r} is not defined under pools")
    orgs = raw.get("orgs", {})
    if isinstance(orgs, dict):
        for org, rule in orgs.items():
            pool = rule.get("pool") if isinstance(rule, dict) else None
            if isinstance(pool, str) and isinstance(pools, dict) and pool not in pools:
                errors.append(f"orgs.{org}.pool: pool {pool!r} is not defined under pools")
        if WILDCARD in orgs:
            errors.append(f"orgs.{WILDCARD}: '*' is only meaningful in routing.per_session_orgs")
    return errors


#: A DNS-1123 label: what a Kubernetes pool's name must be, since it becomes a label value on every
#: object the pool creates (and label values, object names and DNS labels all accept it).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def pool_name_errors(name: str, provider: str) -> list[str]:
    """Why a pool cannot have this name, as error lines naming the field (none when it can)."""
    if provider != "kubernetes" or _DNS_LABEL.fullmatch(name):
        return []
    suggestion = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-") or "pool"
    return [f"pools.{name}: a kubernetes pool's name becomes a label value on each object it creates, so it must "
            f"be a DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or "
            f"digit (rename it, e.g. {suggestion!r})"]


def _pool_names(raw: Mapping[str, Any]) -> list[str]:
    pools = raw.get("pools")
    if not isinstance(pools, dict):
        return []
    return [error for name, pool in pools.items() if isinstance(name, str) and isinstance(pool, dict)
            for error in pool_name_errors(name, str(pool.get("provider", "local")))]


def _provider_options(raw: Mapping[str, Any], checks: Mapping[str, OptionsCheck]) -> list[str]:
    """Each pool's provider section checked by that provider, on the raw mapping like the
    cross-references (so they are reported with every other error)."""
    pools = raw.get("pools")
    if not isinstance(pools, dict):
        return []
    errors = []
    for name, pool in pools.items():
        provider = pool.get("provider", "local") if isinstance(pool, dict) else None
        check = checks.get(provider) if isinstance(provider, str) else None
        section = pool.get(provider) if check is not None else None  # type: ignore[union-attr]
        if check is not None and isinstance(section, dict):
            errors += [f"pools.{name}.{provider}{'.' + path if path else ''}: {message}"
                       for path, message in check(section)]
    return errors


def format_loc(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the dotted field path an error line names."""
    return ".".join(str(part) for part in loc if not str(part).startswith(("function-", "literal[")))


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error.

    Plain YAML keeps the last one silently: an org listed twice under ``orgs`` would lose its
    first settings without a word, which is exactly what a strict policy file must not do.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_policy(text: str, source: str = "<policy>", extra_per_session_orgs: Iterable[str] = (), *,
                 option_checks: Mapping[str, OptionsCheck] | None = None) -> Policy:
    """Parse and validate a policy document; raise :class:`PolicyError` listing every error.

    ``option_checks`` maps a provider name to the check of its pools' provider section
    (``pools.<name>.<provider>``): routing does not know what a provider needs there.
    """
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise PolicyError([f"{source}: not valid YAML{where}: {getattr(exc, 'problem', exc)}"]) from None
    if not isinstance(raw, dict):
        raise PolicyError([f"{source}: the policy must be a mapping with a 'pools' key"])
    errors: list[str] = []
    doc = None
    try:
        doc = PolicyDocument.model_validate(raw, context={_PREFIX_KEYS_CHECKED: True})
    except ValidationError as exc:
        errors = [f"{format_loc(e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]
    errors += _provider_options(raw, option_checks or {})
    errors += _pool_names(raw)
    errors += _cross_references(raw)
    if errors:
        raise PolicyError([f"{source}: {e}" for e in errors])
    assert doc is not None
    return Policy(doc, source, extra_per_session_orgs)


def default_policy(extra_per_session_orgs: Iterable[str] = ()) -> Policy:
    """The embedded default: two local pools, no per-session orgs unless the env says so."""
    doc = PolicyDocument(
        pools={"small": PoolSpec(idle_timeout=600.0), "shared": PoolSpec(idle_timeout=1800.0)},
    )
    return Policy(doc, "<built-in default>", extra_per_session_orgs)
