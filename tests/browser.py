"""A real headless Chromium, driven over the DevTools protocol, for what only a browser does: origins,
same-site cookies, Fetch Metadata, CORS, cookie jars that scripts write to.

Debian's ``chromium`` (``./scripts/test`` installs it as it installs redis-server); the protocol is
spoken with the ``websockets`` package (a test dependency already), no driver in between. Tests that
need it take the ``chromium`` fixture, which skips with a printed reason where no browser can be
started (``CHROMIUM`` names another binary).

``*.localhost`` names resolve to loopback inside Chromium, so preview hosts need no DNS; other names
are mapped to loopback with ``--host-resolver-rules`` (``Browser(map_to_loopback=[...])``), which is
what DNS rebinding does to a name the attacker owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import websockets

STARTUP_TIMEOUT = 30.0
CALL_TIMEOUT = 30.0
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio")


def chromium_binary() -> str | None:
    """The browser to run, or None (then tests that need one skip, saying why)."""
    named = os.environ.get("CHROMIUM")
    if named:
        return named
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class BrowserError(Exception):
    pass


class Browser:
    """One Chromium process and its DevTools connection."""

    def __init__(self, process: asyncio.subprocess.Process, ws: Any, profile: str) -> None:
        self._process = process
        self._ws = ws
        self._profile = profile
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str | None, asyncio.Queue[dict[str, Any]]] = {}
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for raw in self._ws:
            message = json.loads(raw)
            if "id" in message:
                future = self._calls.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
            else:
                self.queue(message.get("sessionId")).put_nowait(message)

    async def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[ident] = future
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self._ws.send(json.dumps(message))
        answer = await asyncio.wait_for(future, CALL_TIMEOUT)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer["result"]  # type: ignore[no-any-return]

    def queue(self, session: str | None) -> asyncio.Queue[dict[str, Any]]:
        """The events of ``session``, in order."""
        return self._events.setdefault(session, asyncio.Queue())

    async def new_page(self) -> Page:
        target = await self.call("Target.createTarget", {"url": "about:blank"})
        attached = await self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        await self.call("Page.enable", session=page.session)
        await self.call("Runtime.enable", session=page.session)
        return page

    async def cookies(self) -> list[dict[str, Any]]:
        return (await self.call("Storage.getCookies"))["cookies"]  # type: ignore[no-any-return]

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.call("Browser.close")
        with contextlib.suppress(Exception):
            await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        await self._process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)


class Page:
    """One tab: navigate it, and run script in whatever page it shows (as that page's own script)."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    async def goto(self, url: str) -> dict[str, Any]:
        """Navigate and wait for the load event; returns the main document's last response (after
        redirects: ``status``, ``headers``, ``url``)."""
        queue = self.browser.queue(self.session)
        while not queue.empty():
            queue.get_nowait()  # what the previous page left
        await self.browser.call("Network.enable", session=self.session)
        await self.browser.call("Page.navigate", {"url": url}, session=self.session)
        responses = []
        while True:
            message = await asyncio.wait_for(queue.get(), CALL_TIMEOUT)
            if message["method"] == "Network.responseReceived" and message["params"]["type"] == "Document":
                responses.append(message["params"]["response"])
            elif message["method"] == "Page.loadEventFired":
                break
        await self.browser.call("Network.disable", session=self.session)
        return responses[-1] if responses else {}

    async def evaluate(self, expression: str) -> Any:
        """Run ``expression`` in the page (awaiting a promise) and return its JSON value."""
        result = await self.browser.call("Runtime.evaluate", {
            "expression": expression, "awaitPromise": True, "returnByValue": True}, session=self.session)
        if "exceptionDetails" in result:
            raise BrowserError(result["exceptionDetails"].get("exception", {}).get("description")
                               or result["exceptionDetails"].get("text"))
        return result["result"].get("value")

    async def text(self) -> str:
        return await self.evaluate("document.body ? document.body.innerText : ''")  # type: ignore[no-any-return]

    async def url(self) -> str:
        return await self.evaluate("location.href")  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def launch(binary: str, map_to_loopback: tuple[str, ...] = ()) -> AsyncIterator[Browser]:
    profile = tempfile.mkdtemp(prefix="sgw-chromium-")
    flags = list(FLAGS)
    if map_to_loopback:
        flags.append("--host-resolver-rules=" + ", ".join(f"MAP {name} 127.0.0.1" for name in map_to_loopback))
    process = await asyncio.create_subprocess_exec(
        binary, *flags, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        endpoint = await asyncio.wait_for(_devtools_endpoint(process), STARTUP_TIMEOUT)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        shutil.rmtree(profile, ignore_errors=True)
        raise
    ws = await websockets.connect(endpoint, max_size=None, ping_interval=None)
    # Chromium keeps writing to stderr: drain it so the pipe never fills and stalls the browser.
    drain = asyncio.ensure_future(_drain(process.stderr))
    browser = Browser(process, ws, profile)
    try:
        yield browser
    finally:
        await browser.close()
        drain.cancel()
        with contextlib.suppress(BaseException):
            await drain


async def _devtools_endpoint(process: asyncio.subprocess.Process) -> str:
    assert process.stderr is not None
    lines = []
    while True:
        line = await process.stderr.readline()
        if not line:
            raise BrowserError("chromium exited before its DevTools endpoint was up: " + b"".join(lines[-5:]).decode(errors="replace"))
        lines.append(line)
        text = line.decode(errors="replace").strip()
        if text.startswith("DevTools listening on "):
            return text.removeprefix("DevTools listening on ")


async def _drain(stream: asyncio.StreamReader | None) -> None:
    while stream is not None and await stream.read(65536):
        pass
