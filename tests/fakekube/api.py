"""The request pipeline of the fake apiserver, independent of HTTP: what a request does to the
store and what it answers. The HTTP layer (server.py) and the simulated controller (controller.py)
both go through it, so controller writes get the same validation, resourceVersions and events.

Order of a write, as in the apiserver: decode (kind/apiVersion check, prune + default in the
request version, unknown fields per fieldValidation) -> strategy (drop status on create and on
main-resource updates; keep only status on status updates; keep system metadata) -> validate
(ObjectMeta + OpenAPI schema, 422 Invalid with causes) -> convert to the storage version ->
store (409 AlreadyExists / Conflict, no-op updates keep their resourceVersion).

Deletion: DeleteOptions preconditions (uid, resourceVersion) and propagationPolicy. Background
(default) deletes now and lets the garbage collector delete dependents (objects whose
ownerReferences all point to deleted owners) right after; Foreground sets deletionTimestamp and
the `foregroundDeletion` finalizer and removes the owner once its dependents are gone; Orphan
strips the ownerReferences from dependents. Objects with finalizers get deletionTimestamp and
disappear when an update removes the last finalizer.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import random
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from . import errors as E
from .convert import from_storage, to_storage
from .crds import CrdSet, ResourceInfo
from .errors import ApiError
from .patch import apply_patch, check_patch_type
from .schema import MISSING, normalize, normalize_object_meta, validate, validate_name, validate_object_meta
from .selectors import Selector
from .store import Event, Store, Watcher

Obj = dict[str, Any]
SYSTEM_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
               "name", "namespace", "selfLink", "managedFields")
GC_FINALIZERS = ("orphan", "foregroundDeletion")
HOLD_FINALIZER = "fakekube.test/slow-deletion"
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def rfc3339(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class CreateRecord:
    """One accepted create: `plural`, `namespace`, `name` (generated names resolved), `actor`, and the
    warnings it was answered with (`unknown field "spec.x"`: a field the schema pruned)."""

    plural: str
    namespace: str
    name: str
    version: str
    actor: str  # "client" (HTTP), "controller", ...
    resource_version: int
    warnings: tuple[str, ...] = ()


@dataclass
class Written:
    obj: Obj
    warnings: list[str] = field(default_factory=list)
    code: int = 200


class Api:
    def __init__(self, crds: CrdSet, store: Store, *, clock: Callable[[], datetime] = utcnow,
                 namespaces: Iterable[str] = ("default",), name_rules: dict[str, str] | None = None,
                 rng: random.Random | None = None):
        self.crds = crds
        self.store = store
        self.clock = clock
        self.namespaces = set(namespaces)
        self.name_rules = {"sandboxes": "label"} if name_rules is None else dict(name_rules)
        self.create_log: list[CreateRecord] = []
        self._rng = rng or random.Random()
        self._gc_pending = False
        # Misbehaviour a test switches on: garbage collection that runs this long after the owner goes,
        # and deletions that a finalizer (HOLD_FINALIZER) holds this long per plural, as a controller's would.
        self.gc_delay = 0.0
        self.deletion_delay: dict[str, float] = {}
        self._deleted_uids: set[str] = set()
        store.subscribe(self._on_event)

    # --- resolution -------------------------------------------------------------------------

    def resource(self, group: str, version: str, plural: str) -> ResourceInfo:
        res = self.crds.find(group, plural)
        if res is None or version not in res.versions or not res.versions[version].served:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        return res

    def _missing(self, res: ResourceInfo, name: str) -> ApiError:
        return ApiError.not_found(res.group, res.plural, name)

    # --- reads ------------------------------------------------------------------------------

    def get(self, res: ResourceInfo, version: str, namespace: str, name: str) -> Obj:
        stored = self.store.get(res.key, namespace, name)
        if stored is None:
            raise self._missing(res, name)
        return from_storage(res, stored, version)

    def list(self, res: ResourceInfo, version: str, namespace: str | None, selector: Selector = Selector(),
             limit: int = 0, continue_token: str | None = None) -> Obj:
        rv = self.store.resource_version
        items = self.store.items(res.key, namespace)
        start = ""
        if continue_token:
            try:
                token = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                token_rv, start = int(token["rv"]), str(token["start"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError.bad_request(f"continue key is not valid: {exc}") from exc
            if token_rv < self.store.oldest_resource_version:
                raise ApiError.expired("The provided continue parameter is too old to display a consistent list "
                                       "result. You can start a new list without the continue parameter.")
            rv = token_rv
        selected = [o for o in items if selector.matches(o) and _ns_name(o) > start]
        meta: Obj = {"resourceVersion": str(rv)}
        if limit and len(selected) > limit:
            selected = selected[:limit]
            token = {"rv": rv, "start": _ns_name(selected[-1])}
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode()
        return {
            "apiVersion": res.api_version(version),
            "kind": res.list_kind,
            "metadata": meta,
            "items": [from_storage(res, o, version) for o in selected],
        }

    # --- create -----------------------------------------------------------------------------

    def create(self, res: ResourceInfo, version: str, namespace: str, body: Any, *,
               field_validation: str = "Warn", actor: str = "client", dry_run: bool = False) -> Written:
        if namespace not in self.namespaces:
            raise ApiError.not_found("", "namespaces", namespace)
        obj, warnings = self._decode(res, version, body, field_validation)
        meta = obj["metadata"]
        if meta.get("namespace", namespace) != namespace:
            raise ApiError.bad_request("the namespace of the provided object does not match the namespace sent "
                                       "on the request")
        if meta.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created", "InternalError")
        for key in ("uid", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(key, None)
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=rfc3339(self.clock()),
                    generation=1)
        if res.versions[version].status_subresource:
            obj.pop("status", None)
        generated = not meta.get("name") and bool(meta.get("generateName"))
        causes = []
        if generated:
            causes = validate_name("metadata.generateName", meta["generateName"].rstrip("-") or "x",
                                   self.name_rules.get(res.plural, "subdomain"))
            meta["name"] = self._generate_name(res, namespace, meta["generateName"])
        self._validate(res, version, obj, None, causes)
        stored = to_storage(res, obj, version)
        if self.store.get(res.key, namespace, meta["name"]) is not None:
            raise ApiError.already_exists(res.group, res.plural, meta["name"])
        if dry_run:
            return Written(from_storage(res, stored, version), warnings, 201)
        event = self.store.put(res.key, stored)
        self.create_log.append(CreateRecord(res.plural, namespace, meta["name"], version, actor, event.rv,
                                            tuple(warnings)))
        return Written(from_storage(res, event.obj, version), warnings, 201)

    def _generate_name(self, res: ResourceInfo, namespace: str, prefix: str) -> str:
        base = prefix[:58]
        for _ in range(8):  # RetryGenerateName
            name = base + "".join(self._rng.choice(_NAME_ALPHABET) for _ in range(5))
            if self.store.get(res.key, namespace, name) is None:
                return name
        return name

    # --- update / patch ---------------------------------------------------------------------

    def replace(self, res: ResourceInfo, version: str, namespace: str, name: str, body: Any, *,
                subresource: str | None = None, field_validation: str = "Warn", actor: str = "client",
                dry_run: bool = False) -> Written:
        obj, warnings = self._decode(res, version, body, field_validation)
        self._check_identity(obj, namespace, name)
        current = self.store.get(res.key, namespace, name)
        if current is None:
            raise self._missing(res, name)
        written = self._update(res, version, obj, current, subresource, dry_run)
        written.warnings[:0] = warnings
        return written

    def patch(self, res: ResourceInfo, version: str, namespace: str, name: str, raw: bytes, content_type: str, *,
              subresource: str | None = None, field_validation: str = "Warn", dry_run: bool = False) -> Written:
        check_patch_type(content_type)
        current = self.store.get(res.key, namespace, name)
        if current is None:
            raise self._missing(res, name)
        old = from_storage(res, current, version)
        patched = apply_patch(old, raw, content_type)
        if not isinstance(patched, dict):
            raise ApiError(422, "the patched object is not a JSON object", "Invalid")
        obj, warnings = self._decode(res, version, patched, field_validation)
        self._check_identity(obj, namespace, name)
        obj["metadata"].setdefault("resourceVersion", old["metadata"]["resourceVersion"])
        written = self._update(res, version, obj, current, subresource, dry_run)
        written.warnings[:0] = warnings
        return written

    def _check_identity(self, obj: Obj, namespace: str, name: str) -> None:
        meta = obj["metadata"]
        if meta.get("name", name) != name:
            raise ApiError.bad_request(f"the name of the object ({meta['name']}) does not match the name on the "
                                       f"URL ({name})")
        if meta.get("namespace", namespace) != namespace:
            raise ApiError.bad_request("the namespace of the provided object does not match the namespace sent "
                                       "on the request")

    def _update(self, res: ResourceInfo, version: str, new: Obj, current: Obj, subresource: str | None,
                dry_run: bool = False) -> Written:
        old = from_storage(res, current, version)
        old_meta, name = old["metadata"], old["metadata"]["name"]
        rv = new["metadata"].get("resourceVersion")
        if not rv:
            raise ApiError.invalid(res.group, res.kind, name, [E.FieldError(
                "FieldValueInvalid", "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update")])
        if rv != old_meta["resourceVersion"]:
            raise ApiError.conflict(res.group, res.plural, name, "the object has been modified; please apply your "
                                                                  "changes to the latest version and try again")
        has_status = res.versions[version].status_subresource
        if subresource == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
        else:
            merged = new
            for key in SYSTEM_META:
                if key in old_meta:
                    merged["metadata"][key] = copy.deepcopy(old_meta[key])
                else:
                    merged["metadata"].pop(key, None)
            if has_status:
                if "status" in old:
                    merged["status"] = copy.deepcopy(old["status"])
                else:
                    merged.pop("status", None)
        causes = []
        if old_meta.get("deletionTimestamp"):
            added = set(merged["metadata"].get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                causes.append(E.forbidden("metadata.finalizers", "no new finalizers can be added if the object is "
                                                                 "being deleted"))
        self._validate(res, version, merged, old, causes)
        ignored = ("metadata", "status") if has_status else ("metadata",)
        if {k: v for k, v in merged.items() if k not in ignored} != {k: v for k, v in old.items() if k not in ignored}:
            merged["metadata"]["generation"] = int(old_meta.get("generation", 1)) + 1
        stored = to_storage(res, merged, version)
        stored["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if stored == current or dry_run:
            return Written(from_storage(res, stored, version))
        if stored["metadata"].get("deletionTimestamp") and not stored["metadata"].get("finalizers"):
            self.store.remove(res.key, _ns(stored), stored["metadata"]["name"])  # the last finalizer is gone
            return Written(from_storage(res, stored, version))
        event = self.store.put(res.key, stored)
        return Written(from_storage(res, event.obj, version))

    # --- delete -----------------------------------------------------------------------------

    def delete(self, res: ResourceInfo, version: str, namespace: str, name: str,
               options: Obj | None = None) -> Written:
        options = options or {}
        current = self.store.get(res.key, namespace, name)
        if current is None:
            raise self._missing(res, name)
        meta = current["metadata"]
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise ApiError.conflict(res.group, res.plural, name, f"Precondition failed: UID in precondition: "
                                                                  f"{pre['uid']}, UID in object meta: {meta['uid']}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise ApiError.conflict(res.group, res.plural, name, f"Precondition failed: ResourceVersion in "
                                                                  f"precondition: {pre['resourceVersion']}, "
                                                                  f"ResourceVersion in object meta: "
                                                                  f"{meta['resourceVersion']}")
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents"):
            policy = "Orphan"
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError.invalid(res.group, res.kind, name, [E.not_supported(
                "propagationPolicy", policy, ["Foreground", "Background", "Orphan"])])
        if meta.get("deletionTimestamp"):
            return Written(from_storage(res, current, version), code=202)
        finalizers = list(meta.get("finalizers") or ())
        extra = {"Orphan": "orphan", "Foreground": "foregroundDeletion"}.get(policy or "")
        if extra and extra not in finalizers:
            finalizers.append(extra)
        hold = self.deletion_delay.get(res.plural)
        if hold is not None and not options.get("dryRun"):
            finalizers.append(HOLD_FINALIZER)
            asyncio.get_running_loop().call_later(hold, self._release, res, namespace, name, meta["uid"])
        if options.get("dryRun"):
            return Written(from_storage(res, current, version), code=202 if finalizers else 200)
        if finalizers:
            meta.update(deletionTimestamp=rfc3339(self.clock()), deletionGracePeriodSeconds=0, finalizers=finalizers,
                        generation=int(meta.get("generation", 1)) + 1)
            event = self.store.put(res.key, current)
            return Written(from_storage(res, event.obj, version), code=202)
        self.store.remove(res.key, namespace, name)
        return Written({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": name, "group": res.group, "kind": res.plural, "uid": meta["uid"]}})

    # --- watch ------------------------------------------------------------------------------

    def open_watch(self, res: ResourceInfo, namespace: str | None, resource_version: str | None
                   ) -> tuple[Watcher, list[tuple[str, Obj, Obj | None]]]:
        """A registered watcher plus the initial events [(type, storage obj, prev)] to send first.

        No resourceVersion or "0": synthetic ADDED events for the current state; N: the history
        after N, or ApiError 410 Expired if N is older than the history."""
        if resource_version in (None, "", "0"):
            watcher, _ = self.store.watch(res.key, namespace, None)  # type: ignore[misc]
            return watcher, [("ADDED", o, None) for o in self.store.items(res.key, namespace)]
        try:
            since = int(resource_version)
        except ValueError as exc:
            raise ApiError.bad_request(f'resourceVersion: Invalid value: "{resource_version}": '
                                       "must be a non-negative integer") from exc
        opened = self.store.watch(res.key, namespace, since)
        if opened is None:
            raise ApiError.expired(f"too old resource version: {since} ({self.store.oldest_resource_version})")
        watcher, backlog = opened
        return watcher, [(e.type, e.obj, e.prev) for e in backlog]

    # --- validation -------------------------------------------------------------------------

    def _decode(self, res: ResourceInfo, version: str, body: Any, field_validation: str) -> tuple[Obj, list[str]]:
        if field_validation not in ("Ignore", "Warn", "Strict"):
            raise ApiError.bad_request(f"fieldValidation parameter unsupported: {field_validation}")
        if not isinstance(body, dict) or not body.get("kind"):
            raise ApiError.bad_request(f"Object 'Kind' is missing in '{json.dumps(body)[:200]}'")
        expected = res.api_version(version)
        if body.get("apiVersion") != expected:
            raise ApiError.bad_request(f"the API version in the data ({body.get('apiVersion')}) does not match the "
                                       f"expected API version ({expected})")
        if body["kind"] != res.kind:
            raise ApiError.bad_request(f"the kind in the data ({body['kind']}) does not match the expected kind "
                                       f"({res.kind})")
        meta = body.get("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError.bad_request(f"{res.kind} in version \"{version}\" cannot be handled as a {res.kind}: "
                                       "metadata must be an object")
        unknown: list[str] = []
        obj = normalize(res.versions[version].schema, body, "", unknown, root=True)
        obj["metadata"] = normalize_object_meta(meta, "metadata", unknown)
        if unknown and field_validation == "Strict":
            fields = ", ".join(f'unknown field "{p}"' for p in unknown)
            raise ApiError.bad_request(f'{res.kind} in version "{version}" cannot be handled as a {res.kind}: '
                                       f"strict decoding error: {fields}")
        return obj, ([f'unknown field "{p}"' for p in unknown] if field_validation == "Warn" else [])

    def _validate(self, res: ResourceInfo, version: str, obj: Obj, old: Obj | None,
                  causes: list[E.FieldError]) -> None:
        causes = causes + validate_object_meta(obj["metadata"], name_rule=self.name_rules.get(res.plural, "subdomain"))
        schema = res.versions[version].schema
        causes += validate(schema, obj, "", old if old is not None else MISSING, root=True) if schema else []
        if causes:
            raise ApiError.invalid(res.group, res.kind, obj["metadata"].get("name", ""), causes)

    # --- garbage collector ------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        meta = event.obj["metadata"]
        if event.type == "DELETED":
            self._deleted_uids.add(meta["uid"])
        elif not (meta.get("deletionTimestamp") and set(meta.get("finalizers") or ()) & set(GC_FINALIZERS)):
            return
        if not self._gc_pending:
            self._gc_pending = True
            asyncio.get_running_loop().call_later(self.gc_delay, self._collect_garbage)

    def _all_objects(self) -> list[tuple[ResourceInfo, Obj]]:
        return [(res, o) for res in self.crds.resources.values() for o in self.store.items(res.key)]

    def _collect_garbage(self) -> None:
        self._gc_pending = False
        objects = self._all_objects()
        live = {o["metadata"]["uid"] for _, o in objects}
        for res, obj in objects:
            refs = obj["metadata"].get("ownerReferences") or []
            if refs and obj["metadata"].get("deletionTimestamp") is None and all(
                    r.get("uid") not in live for r in refs) and any(r.get("uid") in self._deleted_uids for r in refs):
                self._gc_delete(res, obj, "Background")
        for res, obj in objects:
            meta = obj["metadata"]
            finalizers = list(meta.get("finalizers") or ())
            if not meta.get("deletionTimestamp") or not set(finalizers) & set(GC_FINALIZERS):
                continue
            dependents = [(r, o) for r, o in self._all_objects() if any(
                ref.get("uid") == meta["uid"] for ref in o["metadata"].get("ownerReferences") or ())]
            if "orphan" in finalizers:
                for dres, dep in dependents:
                    dep["metadata"]["ownerReferences"] = [
                        ref for ref in dep["metadata"]["ownerReferences"] if ref.get("uid") != meta["uid"]]
                    self.store.put(dres.key, dep)
                finalizers.remove("orphan")
            if "foregroundDeletion" in finalizers:
                pending = [(r, o) for r, o in dependents if self.store.get(r.key, _ns(o), o["metadata"]["name"])]
                for dres, dep in pending:
                    self._gc_delete(dres, dep, "Foreground")
                if any(self.store.get(r.key, _ns(o), o["metadata"]["name"]) for r, o in pending):
                    continue
                finalizers.remove("foregroundDeletion")
            current = self.store.get(res.key, _ns(obj), meta["name"])
            if current is None:
                continue
            current["metadata"]["finalizers"] = finalizers
            if not finalizers:
                current["metadata"].pop("finalizers")
                self.store.remove(res.key, _ns(obj), meta["name"])
            else:
                self.store.put(res.key, current)

    def _release(self, res: ResourceInfo, namespace: str, name: str, uid: str) -> None:
        """Take HOLD_FINALIZER off (the object goes once it has no finalizer left)."""
        current = self.store.get(res.key, namespace, name)
        if current is None or current["metadata"]["uid"] != uid:
            return
        finalizers = [f for f in current["metadata"].get("finalizers") or () if f != HOLD_FINALIZER]
        if finalizers:
            current["metadata"]["finalizers"] = finalizers
            self.store.put(res.key, current)
        else:
            current["metadata"].pop("finalizers", None)
            self.store.remove(res.key, namespace, name)

    def _gc_delete(self, res: ResourceInfo, obj: Obj, policy: str) -> None:
        try:
            self.delete(res, res.storage_version, _ns(obj), obj["metadata"]["name"],
                        {"propagationPolicy": policy})
        except ApiError:
            pass



def _ns(obj: Obj) -> str:
    return obj["metadata"].get("namespace", "")


def _ns_name(obj: Obj) -> str:
    return f"{_ns(obj)}/{obj['metadata']['name']}"
