"""A Kubernetes pool's own options (``pools.<name>.kubernetes`` in the policy), validated here.

Routing keeps the section as a plain mapping: where a pool's sandboxes live in the
cluster decides nothing about routing. The policy parse hands the section to
:func:`option_errors` (through ``gateway.policy``), so its errors still name the
file and the field path and are reported with every other error at once; the
provider then reads it as :class:`KubernetesPoolOptions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from routing.policy import Duration, Policy, format_loc


class KubernetesPoolOptions(BaseModel):
    """Where and how a pool's sandboxes live in Kubernetes (agent-sandbox CRs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = "default"
    # agent-sandbox v1.0 serves v1beta1 only; v1alpha1 for v0.4/v0.5 controllers.
    api_version: Literal["v1alpha1", "v1beta1"] = "v1beta1"
    mode: Literal["sandbox", "claim"] = "sandbox"
    port: int = Field(default=8888, ge=1, le=65535)
    # mode: sandbox
    pod_template: dict[str, Any] | None = None
    volume_claim_templates: list[dict[str, Any]] | None = None
    service: bool | None = None
    shutdown_policy: Literal["Delete", "Retain"] | None = None
    lifetime: Duration | None = None
    # mode: claim
    template: str | None = None
    warm_pool: str | None = None

    @model_validator(mode="after")
    def _mode_fields(self) -> KubernetesPoolOptions:
        if self.mode == "sandbox" and self.pod_template is None:
            raise ValueError("mode 'sandbox' needs pod_template")
        if self.mode == "claim" and self.api_version == "v1alpha1" and not self.template:
            raise ValueError("mode 'claim' with api_version v1alpha1 needs template (the SandboxTemplate name)")
        if self.mode == "claim" and self.api_version == "v1beta1" and not self.warm_pool:
            raise ValueError("mode 'claim' with api_version v1beta1 needs warm_pool (the SandboxWarmPool name)")
        # An option that does not apply is refused, never dropped: the operator meant something by it.
        if self.mode == "claim" and self.api_version == "v1beta1" and self.template:
            raise ValueError("template does not apply to mode 'claim' at api_version v1beta1 (a v1beta1 claim names "
                             "only a warm_pool, whose SandboxWarmPool names the template): remove it")
        unused = [f for f in (("template", "warm_pool") if self.mode == "sandbox" else
                              ("pod_template", "volume_claim_templates", "service")) if getattr(self, f) is not None]
        if unused:
            raise ValueError(f"{', '.join(unused)} does not apply to mode {self.mode!r}: remove it")
        return self


def option_errors(section: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The section's errors as (field path inside it, message): routing's ``OptionsCheck``."""
    try:
        KubernetesPoolOptions.model_validate(section)
    except ValidationError as exc:
        return [(format_loc(e["loc"]), e["msg"]) for e in exc.errors()]
    return []


def pool_options(policy: Policy, pool_names: Sequence[str]) -> dict[str, KubernetesPoolOptions]:
    """The named pools' options, from a policy whose sections ``option_errors`` already passed."""
    return {name: KubernetesPoolOptions.model_validate(policy.pools[name].kubernetes or {}) for name in pool_names}
