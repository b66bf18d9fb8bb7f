"""One typed Settings object, from flags, environment variables and defaults.

Precedence: command-line flags > environment (``SANDBOX_GATEWAY_*``, plus the
unprefixed ``REDIS_URL`` and ``PER_SESSION_SANDBOX_ORG_IDS`` that other systems
already use, and what the platform says about where we run: ``KUBERNETES_SERVICE_HOST``,
``PROMETHEUS_MULTIPROC_DIR``) > defaults. Nothing else in the gateway reads the environment
(the sandbox runtime, ``gateway.runtime``, is a separate program).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BeforeValidator, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


DEFAULT_SESSION_TTL = 86_400.0
"""A binding idle this long is forgotten (``serve`` and the offline ``check-policy`` agree on it)."""

SESSION_TTL_SETTING = "session_ttl (SANDBOX_GATEWAY_SESSION_TTL)"
"""How errors name ``session_ttl``: the policy refuses one shorter than a pool's idle sandboxes live."""

ENV_PREFIX = "SANDBOX_GATEWAY_"

SERVE_FLAGS: dict[str, str] = {
    "host": "--host", "data_port": "--data-port", "control_port": "--control-port", "grpc_port": "--grpc-port",
    "workers": "--workers", "policy_file": "--policy", "data_dir": "--data-dir", "redis_url": "--redis-url",
    "log_level": "--log-level", "log_format": "--log-format", "access_log": "--access-log",
    "auth_mode": "--auth-mode", "auth_keys_file": "--auth-keys", "allowed_hosts": "--allowed-hosts",
    "allow_example_keys": "--allow-example-keys",
}
"""The one map from a setting to the ``serve`` flag that sets it (the CLI builds its overrides from
it; a setting with no flag is set by its environment variable alone). Refusals name both."""

_UNPREFIXED_ENV = {"redis_url": "REDIS_URL", "per_session_org_ids": "PER_SESSION_SANDBOX_ORG_IDS",
                   "kubernetes_service_host": "KUBERNETES_SERVICE_HOST",
                   "prometheus_multiproc_dir": "PROMETHEUS_MULTIPROC_DIR"}


def env_var(field: str) -> str:
    """The environment variable a setting is read from (the unprefixed one where other systems set it)."""
    return _UNPREFIXED_ENV.get(field, ENV_PREFIX + field.upper())


def option(field: str, flags: Mapping[str, str] = SERVE_FLAGS) -> str:
    """How a refusal names a setting: its flag (where the command has one) and its environment variable."""
    flag = flags.get(field)
    return env_var(field) if flag is None else f"{flag} / {env_var(field)}"


def refusal(exc: ValidationError, flags: Mapping[str, str] = SERVE_FLAGS) -> str:
    """One line for the first error of a settings validation: the flag and environment variable to
    change, what is wrong and the value given; never pydantic's field paths or error URLs."""
    error = exc.errors(include_url=False)[0]
    cause = (error.get("ctx") or {}).get("error")
    if not error["loc"]:  # a check across settings (_auth_is_explicit_off_loopback): it names its options
        return str(cause) if cause is not None else error["msg"]
    field = str(error["loc"][0])
    field = next((name for name, env in _UNPREFIXED_ENV.items() if env == field), field)
    message = str(cause) if cause is not None else error["msg"]
    message = message.replace("Input should be", "must be", 1).replace("String should", "must", 1)
    value = error.get("input")
    shown = "" if isinstance(value, dict) or value is None else f" (got {value!r})"
    return f"{option(field, flags)}: {message}{shown}"


def _json_list(value: Any) -> Any:
    """A list setting from the environment is JSON (``'["agents"]'``); refused here, where the error
    names the setting, rather than by pydantic-settings' decoder, whose error names no variable."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise ValueError("must be a JSON list such as [\"a\", \"b\"]") from None


def _name_list(value: Any) -> Any:
    """A list of names from the environment: JSON (``'["a.example", "b.example"]'``) or comma-separated."""
    if isinstance(value, str) and not value.lstrip().startswith("["):
        return [name.strip() for name in value.split(",") if name.strip()]
    return _json_list(value)


def _default_replica_id() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def _per_session_org_ids() -> Any:
    return Field(default=None,
                 validation_alias=AliasChoices("per_session_org_ids", "PER_SESSION_SANDBOX_ORG_IDS"))


class PolicySettings(BaseSettings):
    """What the offline commands (``route``, ``check-policy``) take from the environment: the policy
    inputs alone, so a serving setting they never use (a host without auth) cannot stop a dry run."""

    model_config = SettingsConfigDict(env_prefix="SANDBOX_GATEWAY_", extra="ignore", frozen=True)

    per_session_org_ids: str | None = _per_session_org_ids()
    session_ttl: float = Field(default=DEFAULT_SESSION_TTL, gt=0)  # check-policy checks pools against it


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDBOX_GATEWAY_", extra="forbid", frozen=True)

    # listeners
    host: str = "127.0.0.1"
    data_port: int = Field(default=8080, ge=0, le=65535)
    control_port: int = Field(default=8081, ge=0, le=65535)
    grpc_port: int = Field(default=50051, ge=0, le=65535)  # the gRPC front (gateway/grpcfront); 0 = any free port
    grpc_tls_cert_file: Path | None = None  # with grpc_tls_key_file: the gRPC front speaks TLS (ALPN h2), not h2c
    grpc_tls_key_file: Path | None = None
    # The gRPC front's connection timing (gateway/grpcfront/keeper.py); gRPC servers' own names and defaults
    # where they have one (grpc-go keepalive.ServerParameters / EnforcementPolicy):
    grpc_handshake_timeout: float = Field(default=10.0, gt=0)       # preface + first SETTINGS (and TLS) within this
    grpc_settings_ack_timeout: float = Field(default=10.0, gt=0)    # our SETTINGS ACKed within this
    grpc_idle_timeout: float | None = Field(default=300.0, gt=0)    # no call for this long: GOAWAY NO_ERROR
    grpc_keepalive_min_time: float = Field(default=300.0, gt=0)     # PINGs with no call: no more often than this
    grpc_keepalive_permit_without_calls: bool = False               # else any PING with no call is a strike
    grpc_max_connection_age: float | None = Field(default=None, gt=0)  # GOAWAY NO_ERROR after this (off)
    grpc_max_connection_age_grace: float = Field(default=30.0, ge=0)   # ... then the calls left are ended
    # The bytes one client connection may have in flight towards the front, all its streams together; credited
    # back as the relay hands them on (gateway/grpcfront/connection.py). Each stream still has its 1 MiB window.
    grpc_connection_window: int = Field(default=16 * 1024 * 1024, ge=1024 * 1024, le=2**31 - 1)
    # "auto": one per core this process may run on (sched_getaffinity), or 1 with the in-memory store
    workers: int | Literal["auto"] = 1

    # configuration
    policy_file: Path | None = None
    per_session_org_ids: str | None = _per_session_org_ids()
    data_dir: Path = Path(".sandbox-gateway")
    redis_url: str | None = Field(default=None, validation_alias=AliasChoices("redis_url", "REDIS_URL"))
    redis_prefix: str = "sgw"
    # Replicas that must hold a reservation or a binding before the gateway acts on it (Redis WAIT):
    # 1 keeps them across a failover; short of it within redis_replica_ack_timeout the request gets
    # 503, unless the sentinels see no replica up (docs/deployment.md, "Redis: failover, ...").
    redis_replica_acks: int = Field(default=0, ge=0, le=5)
    redis_replica_ack_timeout: float = Field(default=1.0, gt=0, le=1.5)  # under the 2 s socket timeout
    replica_id: str = Field(default_factory=_default_replica_id)
    # Names this installation's Kubernetes objects (label) so two gateways never touch each other's.
    installation: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    kubeconfig: str | None = None
    # Set by Kubernetes in every pod: without a kubeconfig, the API client uses the pod's service account.
    kubernetes_service_host: str | None = Field(
        default=None, validation_alias=AliasChoices("kubernetes_service_host", "KUBERNETES_SERVICE_HOST"))
    orphan_grace: float = Field(default=600.0, gt=0)
    # /readyz fails once every Kubernetes API call for this long went unanswered, 5xx or refused (401/403).
    kube_api_grace: float = Field(default=60.0, gt=0)
    # Local sandboxes run under bubblewrap; where it cannot run, the gateway refuses to start unless this
    # accepts sandboxes that run as the gateway's user and see the host (its files, its loopback ports).
    local_unconfined: bool = False
    # Local sandboxes running at once on this host (429 beyond); None: derived from the host's memory
    # (gateway/providers/confine.py host_sandbox_cap: 256 MiB each). New local sandboxes are refused (507)
    # while the data dir's filesystem has less free than local_min_free_bytes.
    local_max_sandboxes: int | None = Field(default=None, ge=1)
    local_min_free_bytes: int = Field(default=1024**3, ge=0)
    # Each local sandbox's own filesystem (a sparse image loop-mounted in the sandbox's own mount namespace,
    # gateway/providers/disk.py; root only): full, it answers ENOSPC inside that sandbox alone; the host sees
    # box/disk.img, not the files. 0: none (sandboxes share the data dir's filesystem, files in box/root/).
    local_disk_quota_bytes: int = Field(default=10 * 1024**3, ge=0)

    # authentication (gateway/auth.py): None = trusted headers on loopback only
    auth_mode: Literal["trusted-headers", "token"] | None = None
    auth_keys_file: Path | None = None
    # Off loopback, a key file holding a secret published in this repository (examples/auth/keys.yaml)
    # is refused at startup unless this says the gateway is a demo (gateway/auth.py PUBLISHED_SECRETS).
    allow_example_keys: bool = False
    # Sandbox access tokens (gateway/access.py): the longest lifetime a caller may ask for, in seconds.
    access_token_max_ttl: float = Field(default=86_400.0, ge=1)
    # Host and path keys on the data plane (gateway/proxy/_keys.py), each off unless set:
    # {port}-{sandbox_id}.{preview_domain} and {preview_path_prefix}/{sandbox_id}/{port}/...
    preview_domain: str | None = None
    preview_path_prefix: str | None = Field(default=None, pattern=r"^(/[A-Za-z0-9._~-]+)+$")
    # The data plane as clients reach it (scheme://host[:port]), for the URLs the control API hands out
    # (gateway/grants.py); unset: http://<the host the control API was called by>:<data_port>.
    public_url: str | None = Field(default=None, pattern=r"^https?://[^/?#\s]+$")
    # Path mode gives every sandbox one browser origin (SECURITY.md, "Browsers"): the access-token cookie
    # there would let one sandbox's page drive another's. Off: path URLs take the token in every request
    # (Authorization or ?access_token=). On: only where every sandbox belongs to one tenant.
    preview_path_cookies: bool = False
    # Host names answered on the data plane and the control API (gateway/hosts.py; DNS rebinding): names,
    # ".example.com" for every name under it, or "*". IP literals, the preview domain's hosts and
    # public_url's host are always answered. Unset: localhost names on loopback; off loopback, required.
    allowed_hosts: Annotated[list[str] | None, NoDecode, BeforeValidator(_name_list)] = None
    # kagent's mcp_url (POST /api/sessions/{id}/sandbox): the sandbox's port (unset: its runtime port) and path.
    kagent_mcp_port: int | None = Field(default=None, ge=1, le=65535)
    kagent_mcp_path: str = Field(default="/mcp", pattern=r"^/[A-Za-z0-9._~/-]*$")

    # agent-sandbox router headers (gateway/compat.py): honoured only in these namespaces, only with an
    # admin token, only on these ports; empty = off (the headers are then dropped and never forwarded)
    router_compat_namespaces: Annotated[list[str], NoDecode, BeforeValidator(_json_list)] = []
    router_compat_ports: Annotated[list[int], NoDecode, BeforeValidator(_json_list)] = [8888]
    router_compat_api_version: Literal["v1alpha1", "v1beta1"] = "v1beta1"  # v1alpha1: agent-sandbox v0.4/v0.5

    # logging
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "text"] = "auto"
    access_log: bool = True
    access_log_query: bool = False  # log paths with their query strings (they may carry tokens: off)
    per_org_metrics: bool = False
    # OpenTelemetry traces over OTLP/HTTP (gateway/tracing.py), e.g. http://collector:4318; None: off (free).
    tracing_otlp_endpoint: str | None = Field(default=None, pattern=r"^https?://[^/?#\s]+(/[^?#\s]*)?$")
    tracing_sample_ratio: float = Field(default=1.0, ge=0, le=1)  # of new traces; a client's sampled flag is kept
    # Where prometheus-client's multiprocess mode keeps the workers' values (serve --workers sets it):
    # /metrics then aggregates every worker.
    prometheus_multiproc_dir: str | None = Field(
        default=None, validation_alias=AliasChoices("prometheus_multiproc_dir", "PROMETHEUS_MULTIPROC_DIR"))
    org_label_limit: int = Field(default=100, ge=1)

    # sessions and lifecycle
    route_cache_ttl: float = Field(default=30.0, gt=0)
    route_stale_ttl: float = Field(default=300.0, gt=0)
    # A binding idle this long is forgotten. Checked against the policy at startup and on every reload
    # (Policy.check_session_ttl): a binding must not expire while its sandbox may still run.
    session_ttl: float = Field(default=DEFAULT_SESSION_TTL, gt=0)
    # The lease a replica holds while it creates, suspends or wakes a sandbox, renewed every quarter of it
    # while the replica lives (and at most half a pool's wake_timeout): one that died is taken over
    # within it by the next request, on any replica.
    creation_lease: float = Field(default=10.0, gt=0)
    # How long an operator's suspend (POST /v1/sandboxes/{id}/suspend) waits for the sandbox's open
    # exchanges to end before it answers 409 naming them (?grace= overrides it, ?force=true cuts them).
    suspend_grace: float = Field(default=30.0, ge=0, le=3600)
    reap_interval: float = Field(default=15.0, gt=0)
    activity_flush_interval: float = Field(default=1.0, gt=0)
    drain_timeout: float = Field(default=20.0, ge=0)

    # data plane
    upstream_connect_timeout: float = Field(default=5.0, gt=0)
    upstream_connect_retries: int = Field(default=3, ge=0, le=20)
    upstream_connect_backoff: float = Field(default=0.05, ge=0)
    # Seconds with no byte either way while a response head is awaited; None (the default): no cap. Pools
    # cap the time to the response head with request_timeout, clients with X-Sandbox-Timeout.
    upstream_read_timeout: float | None = Field(default=None, gt=0)
    upstream_pool_size: int = Field(default=256, ge=1)  # idle keep-alive connections kept per sandbox endpoint
    upstream_keepalive_timeout: float = Field(default=30.0, gt=0)
    stream_idle_timeout: float = Field(default=300.0, gt=0)
    trust_forwarded_for: bool = False
    max_header_bytes: int = Field(default=32_768, ge=1024)

    # Connections each client-facing listener (data plane, gRPC front) holds, in all and per source address
    # (gateway/gate.py); None: derived from the descriptor limit (a fifth of it per listener, an eighth of
    # that per address), leaving a reserve for the control API and the sandboxes. Per worker process.
    max_connections: int | None = Field(default=None, ge=1)
    max_connections_per_client: int | None = Field(default=None, ge=1)

    # tenant limits (gateway/limits.py; None = unlimited): for the whole installation with Redis
    # (org_limits_scope "installation": leased in batches, gateway/limit_leases.py), else per replica
    org_limits_scope: Literal["installation", "replica"] = "installation"
    org_rate_limit: float | None = Field(default=None, gt=0)       # requests/s per org (or personal user)
    org_rate_burst: int | None = Field(default=None, ge=1)         # default: ceil(org_rate_limit)
    max_streams_per_org: int | None = Field(default=None, ge=1)    # open WebSocket/SSE streams per org (429 beyond)
    max_body_bytes: int | None = Field(default=None, ge=0)         # request body cap (413 beyond it)
    header_read_timeout: float = Field(default=10.0, gt=0)         # a request head within this (+ up to 25%, random)
    ws_max_message_bytes: int | None = Field(default=None, ge=125) # WebSocket message cap, client to sandbox (close 1009)

    @property
    def limits_shared(self) -> bool:
        """Org limits count for the whole installation: asked for, and there is a Redis to count in."""
        return self.org_limits_scope == "installation" and bool(self.redis_url)

    @property
    def worker_count(self) -> int:
        """``workers`` as a number: ``auto`` is one per usable core, but 1 without REDIS_URL (the memory
        store is one process's: workers would not share sessions)."""
        if self.workers != "auto":
            return self.workers
        if not self.redis_url:
            return 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(64, cores))

    @model_validator(mode="after")
    def _auth_is_explicit_off_loopback(self) -> Settings:
        if self.auth_mode is None and not _is_loopback(self.host):
            raise ValueError(
                f"listening on {self.host} needs an explicit {option('auth_mode')}: 'token' (signed bearer tokens), "
                "or 'trusted-headers' only behind an agent backend on a private network")
        if self.auth_mode == "token" and self.auth_keys_file is None:
            raise ValueError(f"{option('auth_mode')} 'token' needs {option('auth_keys_file')} "
                             "(see examples/auth/keys.yaml)")
        if self.auth_keys_file is None and not _is_loopback(self.host):
            raise ValueError(
                f"listening on {self.host} needs {option('auth_keys_file')}: without keys the control API (binding "
                "and deleting sessions) is open to anyone who reaches it; admin tokens come from that file "
                "(see examples/auth/keys.yaml)")
        if (self.grpc_tls_cert_file is None) != (self.grpc_tls_key_file is None):
            raise ValueError(f"{option('grpc_tls_cert_file')} and {option('grpc_tls_key_file')} go together "
                             "(a PEM certificate chain and its key)")
        if (self.preview_domain or self.preview_path_prefix) and self.auth_keys_file is None:
            raise ValueError(f"{option('preview_domain')} and {option('preview_path_prefix')} need "
                             f"{option('auth_keys_file')}: the sandbox access tokens that open them are signed "
                             "with its keys (see examples/auth/keys.yaml)")
        if self.allowed_hosts is None and not _is_loopback(self.host):
            raise ValueError(
                f"listening on {self.host} needs {option('allowed_hosts')}: the host names clients use to reach "
                "the gateway (a page elsewhere could otherwise re-point its own name at it: DNS rebinding), as a "
                "JSON list or comma-separated, such as gateway.example.com,.internal.example; \"*\" answers any")
        if self.router_compat_namespaces and self.auth_keys_file is None:
            raise ValueError(f"{option('router_compat_namespaces')} needs {option('auth_keys_file')}: the router "
                             "headers are honoured only with an admin token")
        return self

    @field_validator("workers", mode="before")
    @classmethod
    def _workers_number_or_auto(cls, value: Any) -> int | str:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            count = int(value)
        except (TypeError, ValueError):
            count = 0
        if not 1 <= count <= 64 or isinstance(value, float):
            raise ValueError("must be a number of worker processes from 1 to 64, or 'auto'")
        return count

    @field_validator("redis_url")
    @classmethod
    def _redis_url_form(cls, value: str | None) -> str | None:
        if value and "+sentinel://" in value.lower():
            from gateway.store.redis_connect import parse_sentinel_url  # redis-py only when Sentinel is named

            parse_sentinel_url(value)  # a ValueError names what is wrong
        return value

    @field_validator("router_compat_namespaces")
    @classmethod
    def _namespaces_are_names(cls, value: list[str]) -> list[str]:
        for namespace in value:
            if not _DNS_LABEL.fullmatch(namespace):
                raise ValueError(f"{namespace!r} is not a Kubernetes namespace name")
        return value

    @field_validator("preview_domain")
    @classmethod
    def _domain_is_a_name(cls, value: str | None) -> str | None:
        if value is not None:
            value = value.strip(".").lower()
            if not value or not all(_DNS_LABEL.fullmatch(label) for label in value.split(".")):
                raise ValueError(f"{value!r} is not a DNS name (preview hosts are <port>-<sandbox_id>.<preview_domain>)")
        return value

    @field_validator("router_compat_ports")
    @classmethod
    def _ports_are_ports(cls, value: list[int]) -> list[int]:
        for port in value:
            if not 0 < port < 65536:
                raise ValueError(f"{port} is not a TCP port")
        return value

    @property
    def on_loopback(self) -> bool:
        """Listening on a loopback address only (what the demo defaults are safe for)."""
        return _is_loopback(self.host)

    @property
    def effective_auth_mode(self) -> str:
        return self.auth_mode or "trusted-headers"

    @property
    def in_cluster(self) -> bool:
        """Running in a Kubernetes pod with no kubeconfig given: use the pod's service account."""
        return self.kubeconfig is None and bool(self.kubernetes_service_host)

    @property
    def store_kind(self) -> str:
        return "redis" if self.redis_url else "memory"
