"""The resources the fake apiserver serves, loaded from the vendored agent-sandbox CRD YAMLs.

`load_crd_set("v1.0")` is agent-sandbox v1.0 (2026-08-28): the CRDs of tests/fakekube/crds/head
with only v1beta1 served (v1.0 removed v1alpha1 and its conversion webhook); the default.
`load_crd_set("head")` reads tests/fakekube/crds/head as is (v1beta1 storage, v1alpha1 served
and converted: the v0.5 line); `load_crd_set("v0.4.6")` reads tests/fakekube/crds/v0.4.6
(v1alpha1 only). The folder can be overridden with the FAKEKUBE_CRD_DIR environment variable
(read at call time, never at import).
A built-in, schemaless core/v1 `pods` resource is added so simulated pods can be listed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CRD_SETS = ("v1.0", "head", "v0.4.6")
DEFAULT_CRD_SET = "v1.0"
# A CRD set that is a vendored folder with fewer versions served: name -> (folder, versions served).
_SERVING_ONLY = {"v1.0": ("head", frozenset({"v1beta1"}))}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 30x faster on the 8000-line CRDs
# Vendored, unmodified copies of the upstream CRDs (see crds/README.md), so a fresh clone tests offline.
_DEFAULT_CRD_ROOT = Path(__file__).resolve().parent / "crds"


def crd_root() -> Path:
    return Path(os.environ.get("FAKEKUBE_CRD_DIR", _DEFAULT_CRD_ROOT))


@dataclass(frozen=True)
class VersionInfo:
    name: str
    served: bool
    storage: bool
    schema: dict[str, Any] | None  # openAPIV3Schema; None = schemaless (core pods)
    status_subresource: bool
    scale_subresource: dict[str, Any] | None
    deprecated: bool = False
    deprecation_warning: str | None = None


@dataclass(frozen=True)
class ResourceInfo:
    group: str  # "" for core
    plural: str
    singular: str
    kind: str
    list_kind: str
    short_names: tuple[str, ...]
    namespaced: bool
    versions: dict[str, VersionInfo] = field(hash=False)

    @property
    def key(self) -> str:
        """Unique key: "sandboxes.agents.x-k8s.io" ("pods" for core)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def storage_version(self) -> str:
        return next(v.name for v in self.versions.values() if v.storage)

    @property
    def served_versions(self) -> list[str]:
        return [v.name for v in self.versions.values() if v.served]

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version


@dataclass(frozen=True)
class CrdSet:
    name: str
    resources: dict[str, ResourceInfo]  # by key

    def find(self, group: str, plural: str) -> ResourceInfo | None:
        return self.resources.get(f"{plural}.{group}" if group else plural)

    def by_plural(self, plural: str) -> ResourceInfo:
        matches = [r for r in self.resources.values() if r.plural == plural]
        if len(matches) != 1:
            raise KeyError(plural)
        return matches[0]

    def groups(self) -> dict[str, list[ResourceInfo]]:
        out: dict[str, list[ResourceInfo]] = {}
        for res in self.resources.values():
            if res.group:
                out.setdefault(res.group, []).append(res)
        return out


def _resource_from_crd(doc: dict[str, Any]) -> ResourceInfo:
    spec = doc["spec"]
    names = spec["names"]
    versions = {}
    for v in spec["versions"]:
        sub = v.get("subresources") or {}
        versions[v["name"]] = VersionInfo(
            name=v["name"],
            served=bool(v.get("served")),
            storage=bool(v.get("storage")),
            schema=(v.get("schema") or {}).get("openAPIV3Schema"),
            status_subresource="status" in sub,
            scale_subresource=sub.get("scale"),
            deprecated=bool(v.get("deprecated")),
            deprecation_warning=v.get("deprecationWarning"),
        )
    return ResourceInfo(
        group=spec["group"],
        plural=names["plural"],
        singular=names.get("singular", names["kind"].lower()),
        kind=names["kind"],
        list_kind=names.get("listKind", names["kind"] + "List"),
        short_names=tuple(names.get("shortNames") or ()),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        versions=versions,
    )


PODS = ResourceInfo(
    group="", plural="pods", singular="pod", kind="Pod", list_kind="PodList", short_names=("po",),
    namespaced=True,
    versions={"v1": VersionInfo("v1", True, True, None, True, None)},
)


@functools.lru_cache(maxsize=None)
def _load(folder: str) -> CrdSet:
    path = Path(folder)
    resources = {}
    for file in sorted(path.glob("*.yaml")):
        for doc in yaml.load_all(file.read_text(), Loader=_LOADER):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                res = _resource_from_crd(doc)
                resources[res.key] = res
    if not resources:
        raise FileNotFoundError(f"no CustomResourceDefinition YAML in {path}")
    resources[PODS.key] = PODS
    return CrdSet(path.name, resources)


def _serving_only(crds: CrdSet, name: str, served: frozenset[str]) -> CrdSet:
    """``crds`` with every custom resource version outside ``served`` no longer served."""
    resources = {}
    for key, res in crds.resources.items():
        if res is PODS:
            resources[key] = res
            continue
        versions = {v: dataclasses.replace(info, served=info.served and v in served) for v, info in res.versions.items()}
        resources[key] = dataclasses.replace(res, versions=versions)
    return CrdSet(name, resources)


def load_crd_set(name: str) -> CrdSet:
    """The parsed CRDs of one set (cached; treat the result as read-only)."""
    if name not in CRD_SETS:
        raise ValueError(f"crd_set must be one of {CRD_SETS}, got {name!r}")
    if name in _SERVING_ONLY:
        folder, served = _SERVING_ONLY[name]
        return _serving_only(_load(str(crd_root() / folder)), name, served)
    return _load(str(crd_root() / name))
