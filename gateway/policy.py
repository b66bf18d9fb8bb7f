"""The policy as the gateway reads it: routing's parse, plus each provider's check of its own options.

``serve`` (and its hot reload), ``route`` and ``check-policy`` all parse through
here, so a Kubernetes pool's options are checked the same way everywhere and
their errors come with every other error in the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gateway.model import Endpoint
from gateway.providers import kubernetes_options
from gateway.settings import SESSION_TTL_SETTING, Settings
from routing import Policy, PolicyError, PoolSpec, default_policy, parse_org_list
from routing import parse_policy as parse_routing_policy
from routing.policy import OptionsCheck
from routing.ports import PortSet

OPTION_CHECKS: dict[str, OptionsCheck] = {"kubernetes": kubernetes_options.option_errors}


def parse_policy(text: str, source: str = "<policy>", extra_per_session_orgs: Iterable[str] = ()) -> Policy:
    """Parse and validate a policy document; raise ``PolicyError`` listing every error."""
    return parse_routing_policy(text, source, extra_per_session_orgs, option_checks=OPTION_CHECKS)


def load_policy(settings: Settings) -> Policy:
    """The policy file if one is configured, else the built-in default; env orgs merged in.

    Checked against ``session_ttl`` at startup and on every reload: a binding must not expire
    while its sandbox may still run (it could then be claimed by another caller)."""
    extra = parse_org_list(settings.per_session_org_ids)
    if settings.policy_file is None:
        policy = default_policy(extra)
    else:
        path = settings.policy_file
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError([f"{path}: cannot read the policy file: {exc.strerror}"]) from None
        policy = parse_policy(text, str(path), extra)
    policy.check_session_ttl(settings.session_ttl, SESSION_TTL_SETTING)
    return policy


def request_timeouts(policy: Policy) -> dict[str, float]:
    """Pool name -> ``request_timeout`` for the pools that set one (what the data plane enforces)."""
    return {name: pool.request_timeout for name, pool in policy.pools.items() if pool.request_timeout is not None}


def allowed_ports(pool: PoolSpec | None, endpoint: Endpoint) -> PortSet:
    """The ports of a sandbox at ``endpoint`` that the data plane may reach: its pool's ``ports``,
    else the runtime port alone. A sandbox on a Unix socket (local) answers on that socket only,
    so only its runtime port, whatever the pool says (the policy refuses ``ports`` on local pools)."""
    if endpoint.unix is not None or pool is None or pool.port_set is None:
        return PortSet.single(endpoint.port)
    return pool.port_set


class PolicyView:
    """The policy in force, owned by the router: every part reads it here (the pools, the ports a
    sandbox opens, the pools' request timeouts), and a part that keeps something derived from it
    (the data plane's request timeouts, read per request) subscribes, so a hot reload
    (:meth:`replace`) reaches every consumer and none keeps a copy by hand."""

    __slots__ = ("_policy", "_subscribers", "request_timeouts")

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._subscribers: list[Callable[[PolicyView], None]] = []
        # Pool name -> request_timeout, for the pools that set one: what the data plane enforces.
        self.request_timeouts = request_timeouts(policy)

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def pools(self) -> Mapping[str, PoolSpec]:
        return self._policy.pools

    def pool(self, name: str) -> PoolSpec | None:
        """The spec of pool ``name``, or None for a pool no longer in the policy."""
        return self._policy.pools.get(name)

    def allowed_ports(self, pool: str, endpoint: Endpoint) -> PortSet:
        """The ports of pool ``pool``'s sandbox at ``endpoint`` that the data plane may reach."""
        return allowed_ports(self._policy.pools.get(pool), endpoint)

    def subscribe(self, on_replace: Callable[[PolicyView], None]) -> None:
        """Call ``on_replace`` with this view now, and again whenever the policy is replaced."""
        self._subscribers.append(on_replace)
        on_replace(self)

    def replace(self, policy: Policy) -> None:
        """Put ``policy`` in force (a hot reload) and tell every subscriber."""
        self._policy = policy
        self.request_timeouts = request_timeouts(policy)
        for on_replace in self._subscribers:
            on_replace(self)
