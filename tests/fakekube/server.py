"""The fake kube-apiserver over HTTP (aiohttp), for the real kubernetes_asyncio client.

Served paths (group/version/plural resolved against the chosen CRD set, served versions only):

  /version, /api, /api/v1, /apis, /apis/{group}, /apis/{group}/{version}       discovery
  /api/v1/namespaces[/{ns}]                                                    GET
  /api/v1/namespaces/{ns}/pods[/{name}], /api/v1/pods                          GET, list/watch
  /apis/{g}/{v}/namespaces/{ns}/{plural}                                       GET list/watch, POST
  /apis/{g}/{v}/namespaces/{ns}/{plural}/{name}                                GET, PUT, PATCH, DELETE
  /apis/{g}/{v}/namespaces/{ns}/{plural}/{name}/status                         GET, PUT, PATCH
  /apis/{g}/{v}/{plural}                                                       GET list/watch, all namespaces

Watches (`watch=true|1`) stream newline-delimited JSON events; a resourceVersion older than the
history answers 200 with one ERROR event carrying a 410 Expired Status, as the apiserver does.
Test hooks: `drop_watches()`, `compact()`, `send_bookmarks()`, `create_count()`, `create_calls`,
`add_namespace()`, `get_object()`, `list_objects()`, `wait_for_object()`, `wait_for_watchers()`.
Misbehaviour (faults.py): `faults.inject(...)` (429 + Retry-After, 5xx, stalls, dropped connections,
non-200 watches), `restart(down_for)` (watches and their cache lost), `connections` (open TCP
connections, to bound a client's), `api.gc_delay` and `api.deletion_delay` (garbage collection and
finalizer-held deletion that take time).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from aiohttp import web

from .api import Api, CreateRecord, rfc3339, utcnow
from .convert import from_storage
from .crds import DEFAULT_CRD_SET, PODS, ResourceInfo, load_crd_set
from .errors import ApiError
from .faults import Faults
from .selectors import Selector
from .store import DROP, END, Bookmark, Event, Store

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_TRUE = ("true", "1")


def _json(body: Any, status: int = 200, warnings: list[str] | None = None) -> web.Response:
    resp = web.json_response(body, status=status)
    for warning in warnings or ():
        resp.headers.add("Warning", '299 - "' + warning.replace('"', '\\"') + '"')
    return resp


class FakeKubeServer:
    """Store + request pipeline + aiohttp app. `start()` binds 127.0.0.1 on a free port."""

    def __init__(self, crd_set: str = DEFAULT_CRD_SET, *, history_size: int = 1000, namespaces: tuple[str, ...] = ("default",),
                 token: str | None = None, clock: Callable[[], datetime] = utcnow,
                 name_rules: dict[str, str] | None = None):
        self.crd_set = crd_set
        self.crds = load_crd_set(crd_set)
        self.store = Store(history_size)
        self.api = Api(self.crds, self.store, clock=clock, namespaces=namespaces, name_rules=name_rules)
        self.token = token
        self.faults = Faults()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._namespace_created = {ns: rfc3339(clock()) for ns in namespaces}
        self.app = web.Application(middlewares=[self._middleware])
        self._add_routes()

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        # handler_cancellation: a client that goes away cancels its request, as the apiserver's request
        # context does. A watch whose selector matches nothing more never writes, so without this it would
        # never notice the disconnect and would stay registered (and woken by every event) until its timeout.
        self._runner = web.AppRunner(self.app, shutdown_timeout=1.0, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0]
        self.url = f"http://{host}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        self.store.end_watches(abrupt=False)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- test hooks -------------------------------------------------------------------------

    def restart(self, down_for: float = 0.0) -> None:
        """An apiserver restart: every watch and keep-alive connection is cut, the watch cache is
        lost (a watch from an older resourceVersion gets 410) and, for ``down_for`` seconds, every
        new connection is dropped."""
        if down_for:
            self.faults.down(down_for)
        self.store.compact()
        self.store.end_watches(True)
        if self._runner is not None and self._runner.server is not None:
            for handler in self._runner.server.connections:
                handler.force_close()
                if handler.transport is not None:
                    handler.transport.abort()

    @property
    def connections(self) -> int:
        """Open TCP connections to this server (a watch holds one; pooled keep-alives count too)."""
        if self._runner is None or self._runner.server is None:
            return 0
        return len(self._runner.server.connections)

    def drop_watches(self, *, abrupt: bool = True) -> int:
        """Close every open watch stream; abrupt = cut the TCP connection mid-stream (the client
        sees a payload error), else end the stream cleanly like a server-side timeout."""
        return self.store.end_watches(abrupt)

    def send_bookmarks(self) -> None:
        """A BOOKMARK event (current resourceVersion) on every open watch that allowed bookmarks."""
        self.store.bookmark_watches()

    def compact(self) -> None:
        """Forget the event history: a watch from any older resourceVersion now gets 410 Expired."""
        self.store.compact()

    @property
    def open_watches(self) -> int:
        return self.store.open_watches

    @property
    def resource_version(self) -> int:
        return self.store.resource_version

    @property
    def create_calls(self) -> list[CreateRecord]:
        return list(self.api.create_log)

    def create_count(self, plural: str, namespace: str, name: str, *, actor: str | None = None) -> int:
        return sum(1 for c in self.api.create_log if (c.plural, c.namespace, c.name) == (plural, namespace, name)
                   and (actor is None or c.actor == actor))

    def add_namespace(self, namespace: str) -> None:
        self.api.namespaces.add(namespace)
        self._namespace_created.setdefault(namespace, rfc3339(self.api.clock()))

    def get_object(self, plural: str, namespace: str, name: str, version: str | None = None) -> dict[str, Any] | None:
        """The object as served in `version` (default: the storage version), bypassing HTTP; None if absent."""
        res = self.crds.by_plural(plural)
        stored = self.store.get(res.key, namespace, name)
        return None if stored is None else from_storage(res, stored, version or res.storage_version)

    def list_objects(self, plural: str, namespace: str | None = None,
                     version: str | None = None) -> list[dict[str, Any]]:
        """All objects of `plural` (in `namespace`, or everywhere), bypassing HTTP."""
        res = self.crds.by_plural(plural)
        return [from_storage(res, o, version or res.storage_version) for o in self.store.items(res.key, namespace)]

    async def wait_for_object(self, plural: str, namespace: str, name: str,
                              predicate: Callable[[dict[str, Any]], bool] | None = None, *,
                              version: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
        """The object once it exists (and satisfies `predicate`), woken by store events, not polling."""
        res = self.crds.by_plural(plural)

        def matching() -> dict[str, Any] | None:
            obj = self.get_object(plural, namespace, name, version)
            return obj if obj is not None and (predicate is None or predicate(obj)) else None

        found = matching()
        if found is not None:
            return found
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        def on_event(event: Event) -> None:
            if (event.resource, event.namespace, event.name) == (res.key, namespace, name) and not future.done():
                obj = matching()
                if obj is not None:
                    future.set_result(obj)

        unsubscribe = self.store.subscribe(on_event)
        try:
            async with asyncio.timeout(timeout):
                return await future
        finally:
            unsubscribe()

    async def wait_for_watchers(self, count: int, *, timeout: float = 5.0) -> None:
        """Until at least `count` watch streams are open (woken on every watch open/close)."""
        async with asyncio.timeout(timeout):
            while self.store.open_watches < count:
                changed = asyncio.Event()
                unsubscribe = self.store.on_watchers_changed(changed.set)
                try:
                    await changed.wait()
                finally:
                    unsubscribe()

    # --- HTTP -------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _json(ApiError(401, "Unauthorized", "Unauthorized").body, 401)
        fault = self.faults.take(request)
        if fault is not None:
            answer = await self.faults.answer(request, fault)
            if answer is not None:
                return answer
            if fault.drop_after:
                try:
                    await handler(request)
                except ApiError:
                    pass
                self.faults.cut(request)
        try:
            return await handler(request)
        except ApiError as err:
            return _json(err.body, err.code)
        except web.HTTPException as exc:
            if exc.status == 404:
                return _json(ApiError(404, "the server could not find the requested resource").body, 404)
            if exc.status == 405:
                return _json(ApiError(405, f"the server does not allow this method on the requested resource "
                                           f"({request.method})", "MethodNotAllowed").body, 405)
            raise

    def _add_routes(self) -> None:
        r = self.app.router
        for path, handler in (("/version", self._version), ("/api", self._core_versions),
                              ("/api/v1", self._core_resources), ("/apis", self._groups),
                              ("/apis/{group}", self._group), ("/apis/{group}/{version}", self._group_version)):
            r.add_get(path, handler)
            r.add_get(path + "/", handler)  # the generated clients ask for "/apis/", "/version/"
        r.add_get("/api/v1/namespaces", self._namespaces)
        r.add_get("/api/v1/namespaces/{ns}", self._namespace)
        r.add_get("/api/v1/pods", self._pods)
        r.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._pod)
        base = "/apis/{group}/{version}"
        r.add_get(base + "/{plural}", self._collection)
        r.add_route("*", base + "/namespaces/{ns}/{plural}", self._collection)
        r.add_route("*", base + "/namespaces/{ns}/{plural}/{name}", self._item)
        r.add_route("*", base + "/namespaces/{ns}/{plural}/{name}/{sub}", self._item)

    # discovery

    async def _version(self, request: web.Request) -> web.Response:
        return _json({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fakekube", "gitCommit": "0" * 40,
                      "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0",
                      "compiler": "gc", "platform": "linux/amd64"})

    async def _core_versions(self, request: web.Request) -> web.Response:
        return _json({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})

    async def _core_resources(self, request: web.Request) -> web.Response:
        return _json({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
             "verbs": ["get", "list"], "shortNames": ["ns"]},
            {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
             "verbs": ["get", "list", "watch"], "shortNames": ["po"]}]})

    def _group_doc(self, group: str, resources: list[ResourceInfo]) -> dict[str, Any]:
        served = [v for v in resources[0].versions.values() if v.served]
        preferred = next((v for v in served if v.storage), served[0]).name
        order = sorted((v.name for v in served), key=lambda n: n != preferred)
        return {"name": group, "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in order],
                "preferredVersion": {"groupVersion": f"{group}/{preferred}", "version": preferred}}

    async def _groups(self, request: web.Request) -> web.Response:
        groups = [self._group_doc(g, rs) for g, rs in sorted(self.crds.groups().items())]
        return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def _group(self, request: web.Request) -> web.Response:
        resources = self.crds.groups().get(request.match_info["group"])
        if not resources:
            raise web.HTTPNotFound()
        group = self._group_doc(request.match_info["group"], resources)
        return _json({"kind": "APIGroup", "apiVersion": "v1", **group})

    async def _group_version(self, request: web.Request) -> web.Response:
        group, version = request.match_info["group"], request.match_info["version"]
        listed = []
        for res in self.crds.groups().get(group, []):
            info = res.versions.get(version)
            if info is None or not info.served:
                continue
            listed.append({"name": res.plural, "singularName": res.singular, "namespaced": res.namespaced,
                           "kind": res.kind, "shortNames": list(res.short_names),
                           "verbs": ["delete", "get", "list", "patch", "create", "update", "watch"]})
            if info.status_subresource:
                listed.append({"name": f"{res.plural}/status", "singularName": "", "namespaced": res.namespaced,
                               "kind": res.kind, "verbs": ["get", "patch", "update"]})
        if not listed:
            raise web.HTTPNotFound()
        return _json({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}",
                      "resources": listed})

    # namespaces and pods

    def _namespace_doc(self, name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": name, "uid": f"ns-{name}", "creationTimestamp": self._namespace_created[name],
            "resourceVersion": "1", "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}

    async def _namespaces(self, request: web.Request) -> web.Response:
        return _json({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": "1"},
                      "items": [self._namespace_doc(n) for n in sorted(self.api.namespaces)]})

    async def _namespace(self, request: web.Request) -> web.Response:
        name = request.match_info["ns"]
        if name not in self.api.namespaces:
            raise ApiError.not_found("", "namespaces", name)
        return _json(self._namespace_doc(name))

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, PODS, "v1", request.match_info.get("ns"))

    async def _pod(self, request: web.Request) -> web.Response:
        return _json(self.api.get(PODS, "v1", request.match_info["ns"], request.match_info["name"]))

    # custom resources

    def _resolve(self, request: web.Request) -> tuple[ResourceInfo, str, list[str]]:
        m = request.match_info
        res = self.api.resource(m["group"], m["version"], m["plural"])
        info = res.versions[m["version"]]
        warnings = [info.deprecation_warning] if info.deprecated and info.deprecation_warning else []
        return res, m["version"], warnings

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        res, version, warnings = self._resolve(request)
        ns = request.match_info.get("ns")
        if request.method == "GET":
            return await self._list_or_watch(request, res, version, ns, warnings)
        if request.method == "POST" and ns is not None:
            written = self.api.create(res, version, ns, await self._body(request),
                                      field_validation=request.query.get("fieldValidation", "Warn"),
                                      dry_run=request.query.get("dryRun") == "All")
            return _json(written.obj, written.code, warnings + written.warnings)
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])

    async def _item(self, request: web.Request) -> web.StreamResponse:
        res, version, warnings = self._resolve(request)
        ns, name, sub = request.match_info["ns"], request.match_info["name"], request.match_info.get("sub")
        if sub is not None and (sub != "status" or not res.versions[version].status_subresource):
            raise web.HTTPNotFound()
        q = request.query
        validation = q.get("fieldValidation", "Warn")
        dry_run = q.get("dryRun") == "All"
        if request.method == "GET":
            return _json(self.api.get(res, version, ns, name), warnings=warnings)
        if request.method == "PUT":
            written = self.api.replace(res, version, ns, name, await self._body(request), subresource=sub,
                                       field_validation=validation, dry_run=dry_run)
        elif request.method == "PATCH":
            written = self.api.patch(res, version, ns, name, await request.read(),
                                     request.headers.get("Content-Type", ""), subresource=sub,
                                     field_validation=validation, dry_run=dry_run)
        elif request.method == "DELETE" and sub is None:
            options = await self._body(request, optional=True) or {}
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in q:
                    options.setdefault(key, q[key])
            if q.get("orphanDependents") in _TRUE:
                options.setdefault("orphanDependents", True)
            if dry_run:
                options["dryRun"] = ["All"]
            written = self.api.delete(res, version, ns, name, options)
        else:
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "PUT", "PATCH", "DELETE"])
        return _json(written.obj, written.code, warnings + written.warnings)

    async def _body(self, request: web.Request, optional: bool = False) -> Any:
        raw = await request.read()
        if not raw.strip():
            if optional:
                return None
            raise ApiError.bad_request("the body of the request was empty")
        media = request.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if media not in ("application/json", "*/*", ""):
            raise ApiError.unsupported_media_type(media)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc

    # list and watch

    async def _list_or_watch(self, request: web.Request, res: ResourceInfo, version: str, ns: str | None,
                             warnings: list[str] | None = None) -> web.StreamResponse:
        q = request.query
        selector = Selector.parse(q.get("labelSelector"), q.get("fieldSelector"))
        if q.get("watch", "").lower() in _TRUE:
            return await self._watch(request, res, version, ns, selector)
        try:
            limit = int(q.get("limit", "0") or 0)
        except ValueError as exc:
            raise ApiError.bad_request(f"limit: invalid value {q.get('limit')!r}") from exc
        return _json(self.api.list(res, version, ns, selector, limit, q.get("continue")), warnings=warnings)

    async def _watch(self, request: web.Request, res: ResourceInfo, version: str, ns: str | None,
                     selector: Selector) -> web.StreamResponse:
        q = request.query
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        bookmarks = q.get("allowWatchBookmarks", "").lower() in _TRUE
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        progress = self.store.resource_version  # every event up to here is sent once `initial` is
        try:
            watcher, initial = self.api.open_watch(res, ns, q.get("resourceVersion"))
        except ApiError as err:
            if err.code != 410:
                raise
            await resp.prepare(request)
            await resp.write(json.dumps({"type": "ERROR", "object": err.body}).encode() + b"\n")
            await resp.write_eof()
            return resp

        async def send(kind: str, obj: dict[str, Any], prev: dict[str, Any] | None) -> None:
            if kind == "MODIFIED":
                now, before = selector.matches(obj), selector.matches(prev)
                kind = "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else ""
            elif not selector.matches(obj):
                kind = ""
            if kind:
                event = {"type": kind, "object": from_storage(res, obj, version)}
                await resp.write(json.dumps(event).encode() + b"\n")

        async def bookmark(rv: int) -> None:
            if bookmarks:
                meta = {"resourceVersion": str(rv)}
                mark = {"kind": res.kind, "apiVersion": res.api_version(version), "metadata": meta}
                await resp.write(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None
        try:
            await resp.prepare(request)
            for kind, obj, prev in initial:
                await send(kind, obj, prev)
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
                if item is DROP:
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if item is END:
                    break
                if isinstance(item, Bookmark):
                    progress = max(progress, item.rv)
                    await bookmark(progress)
                    continue
                await send(item.type, item.obj, item.prev)
                progress = item.rv
            # nothing queued = nothing pending for this watch: the current resourceVersion is safe
            await bookmark(self.store.resource_version if watcher.queue.empty() else progress)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away
        finally:
            self.store.unwatch(watcher)
        return resp
