"""Conversion between served versions, mirroring agent-sandbox's conversion webhook
(api/v1alpha1/sandbox_conversion.go, extensions/api/v1alpha1/*_conversion.go).

Only the `head` CRD set has two versions (v1beta1 = storage, v1alpha1 = served). Objects are
stored once, in the storage version; a request in the other version is converted on the way in
(`to_storage`) and every response/watch event on the way out (`from_storage`).

What differs and how it is converted (v1alpha1 <-> v1beta1):

- Sandbox: `spec.replicas` (0|1) <-> `spec.operatingMode` (0 -> Suspended, else Running; back:
  Suspended -> 0, else 1). `status.replicas` (v1alpha1 only) is derived from operatingMode on the
  way out; `status.nodeName` (v1beta1 only) is dropped on the way out.
- SandboxClaim: `spec.sandboxTemplateRef.name` + `spec.warmpool` ("none" | "default" | a pool
  name) <-> `spec.warmPoolRef.name`: a specific pool keeps its name; otherwise, if the claim
  already has a warm sandbox (`status.sandbox.name` != claim name) its pool name (sandbox name
  minus the random suffix), else `shadow-pool-<template>`. Back: `shadow-pool-X` -> template X
  with warmpool "default"; any other name -> that name as both. `spec.volumeClaimTemplates`
  (v1beta1 only) is dropped on the way out (lossy, as upstream).
- SandboxWarmPool: `spec.replicas` required (v1alpha1) vs defaulted to 1 (v1beta1);
  `status.observedGeneration` (v1beta1 only) dropped on the way out.
- SandboxTemplate: `spec.volumeClaimTemplatesPolicy` (v1beta1 only) dropped on the way out.

Like upstream, a write in v1alpha1 stores the original v1alpha1 object as JSON in an annotation
(`api.agents.x-k8s.io/v1alpha1-<kind>-state`, visible in v1beta1 reads, stripped from v1alpha1
reads) and v1alpha1 reads use it to restore the claim's template/warmpool exactly.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from .crds import ResourceInfo

STATE_ANNOTATIONS = {
    "sandboxes": "api.agents.x-k8s.io/v1alpha1-sandbox-state",
    "sandboxclaims": "api.agents.x-k8s.io/v1alpha1-sandboxclaim-state",
    "sandboxwarmpools": "api.agents.x-k8s.io/v1alpha1-sandboxwarmpool-state",
}
SHADOW_POOL_PREFIX = "shadow-pool-"

Obj = dict[str, Any]


def strip_random_suffix(name: str) -> str:
    head, sep, _ = name.rpartition("-")
    return head if sep else name


def is_specific_pool(policy: str | None) -> bool:
    return policy not in (None, "", "none", "default")


# --- per-kind spec/status conversions (up = v1alpha1 -> v1beta1) -------------------------------

def _sandbox_up(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    replicas = spec.pop("replicas", None)
    spec["operatingMode"] = "Suspended" if replicas == 0 else "Running"
    obj.get("status", {}).pop("replicas", None)


def _sandbox_down(obj: Obj, original: Obj | None) -> None:
    spec = obj.setdefault("spec", {})
    suspended = spec.pop("operatingMode", "Running") == "Suspended"
    spec["replicas"] = 0 if suspended else 1
    status = obj.setdefault("status", {})
    status.pop("nodeName", None)
    status["replicas"] = 0 if suspended else 1


def _claim_up(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    template = (spec.pop("sandboxTemplateRef", None) or {}).get("name", "")
    policy = spec.pop("warmpool", None)
    sandbox_name = (obj.get("status", {}).get("sandbox") or {}).get("name", "")
    if is_specific_pool(policy):
        pool = policy
    elif sandbox_name and sandbox_name != obj.get("metadata", {}).get("name"):
        pool = strip_random_suffix(sandbox_name)
    else:
        pool = SHADOW_POOL_PREFIX + template
    spec["warmPoolRef"] = {"name": pool}


def _claim_down(obj: Obj, original: Obj | None) -> None:
    spec = obj.setdefault("spec", {})
    pool = (spec.pop("warmPoolRef", None) or {}).get("name", "")
    spec.pop("volumeClaimTemplates", None)
    if pool.startswith(SHADOW_POOL_PREFIX):
        spec["sandboxTemplateRef"] = {"name": pool[len(SHADOW_POOL_PREFIX):]}
        spec["warmpool"] = "default"
    else:
        spec["sandboxTemplateRef"] = {"name": pool}
        spec["warmpool"] = pool
    if original is None:
        return
    orig_spec = original.get("spec") or {}
    orig_template = orig_spec.get("sandboxTemplateRef") or {"name": ""}
    orig_policy = orig_spec.get("warmpool")
    expected = orig_policy if is_specific_pool(orig_policy) else orig_template.get("name", "")
    sandbox_name = (obj.get("status", {}).get("sandbox") or {}).get("name", "")
    matching = pool in (expected, SHADOW_POOL_PREFIX + expected) or (
        sandbox_name and pool in (sandbox_name, strip_random_suffix(sandbox_name)))
    spec["sandboxTemplateRef"] = copy.deepcopy(orig_template)
    if matching:
        if orig_policy is None:
            spec.pop("warmpool", None)
        else:
            spec["warmpool"] = orig_policy
    else:
        spec["warmpool"] = pool


def _pool_up(obj: Obj) -> None:
    pass


def _pool_down(obj: Obj, original: Obj | None) -> None:
    spec = obj.setdefault("spec", {})
    if spec.get("replicas") is None:
        spec["replicas"] = 1
    obj.get("status", {}).pop("observedGeneration", None)


def _template_up(obj: Obj) -> None:
    pass


def _template_down(obj: Obj, original: Obj | None) -> None:
    obj.get("spec", {}).pop("volumeClaimTemplatesPolicy", None)


_UP: dict[str, Callable[[Obj], None]] = {
    "sandboxes": _sandbox_up, "sandboxclaims": _claim_up,
    "sandboxwarmpools": _pool_up, "sandboxtemplates": _template_up,
}
_DOWN: dict[str, Callable[[Obj, Obj | None], None]] = {
    "sandboxes": _sandbox_down, "sandboxclaims": _claim_down,
    "sandboxwarmpools": _pool_down, "sandboxtemplates": _template_down,
}


def _check_pair(res: ResourceInfo, a: str, b: str) -> None:
    if {a, b} != {"v1alpha1", "v1beta1"}:
        raise ValueError(f"no conversion for {res.key} between {a} and {b}")


def to_storage(res: ResourceInfo, obj: Obj, version: str) -> Obj:
    """`obj` (in `version`) converted to the storage version."""
    out = copy.deepcopy(obj)
    target = res.storage_version
    out["apiVersion"] = res.api_version(target)
    if version == target:
        return out
    _check_pair(res, version, target)
    annotation = STATE_ANNOTATIONS.get(res.plural)
    if annotation:
        state = copy.deepcopy(obj)
        (state.get("metadata", {}).get("annotations") or {}).pop(annotation, None)
        out.setdefault("metadata", {}).setdefault("annotations", {})[annotation] = json.dumps(
            state, separators=(",", ":"), sort_keys=True)
    _UP[res.plural](out)
    return out


def from_storage(res: ResourceInfo, obj: Obj, version: str) -> Obj:
    """The stored `obj` as served in `version`."""
    out = copy.deepcopy(obj)
    source = res.storage_version
    out["apiVersion"] = res.api_version(version)
    if version == source:
        return out
    _check_pair(res, version, source)
    original = None
    annotation = STATE_ANNOTATIONS.get(res.plural)
    annotations = out.get("metadata", {}).get("annotations")
    if annotation and annotations and annotation in annotations:
        try:
            original = json.loads(annotations.pop(annotation))
        except ValueError:
            original = None
        if not annotations:
            del out["metadata"]["annotations"]
    _DOWN[res.plural](out, original)
    if out.get("status") == {}:
        del out["status"]
    return out
