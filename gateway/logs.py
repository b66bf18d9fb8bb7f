"""Logging: JSON lines for machines, plain text for a terminal.

``auto`` picks text when stderr is a terminal and JSON otherwise, so a
container's logs are structured without a flag. Fields passed with
``extra={"fields": {...}}`` become top-level JSON keys (the access log uses it).
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import sys
import time
from time import time as _time
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from gateway.log_writer import threaded


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%SZ")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


class MalformedRequestsAreInfo(logging.Filter):
    """aiohttp logs every unparseable request to the control API as an ERROR with a traceback.

    That is a client's mistake, not ours, and anyone who reaches the port could fill the log
    with it: one INFO line without the traceback instead. (aiohttp answers such a request itself,
    with a plain-text 400, before any middleware of ours runs.)
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "malformed HTTP request on the control API: %s", (exc.message,)
            record.exc_info = record.exc_text = None
        return True


class AccessLog:
    """One line per data-plane request, in the nginx/Envoy shape, in the format of the other log lines.

    Fields: method, path (the query string dropped unless ``keep_query``: it may carry tokens),
    status, bytes in and out, duration, upstream time (request head sent to response head, as
    nginx's ``$upstream_header_time``), request ID, session, org, sandbox, pool, protocol, and the
    error code when the gateway answered itself (or why the sandbox side failed after the response
    started). A request too malformed to have a method or target logs ``-`` for them.

    Not a ``logging.Logger``: a LogRecord and the JSON formatter cost about 35 us per request,
    more than proxying it, and stderr is line-buffered (a write syscall per line). This formats
    the line directly: generated tokens (request IDs, sandbox IDs, methods, error codes) as they
    are, caller-chosen strings (path, session, org, pool) JSON-escaped when they need it, through
    a small cache since they repeat. Lines are kept until ``flush`` (the app calls it four times
    a second, at ``max_pending`` lines and when it stops) and ``configure_logging`` makes every
    other log line flush them first, so the log stays in the order things happened.
    """

    def __init__(self, stream: Any, *, json_lines: bool, max_pending: int = 512, keep_query: bool = False) -> None:
        self._stream = stream
        self._json = json_lines
        self.keep_query = keep_query
        self._pending: list[str] = []
        self._max_pending = max_pending
        self._quoted: dict[str | None, str] = {None: "null" if json_lines else "-"}
        self._whos: dict[str | None, tuple[Any, ...]] = {}  # session -> (org, sandbox, pool, their four fields)
        self._whats: dict[str, tuple[Any, ...]] = {}  # target -> (method, status, their three fields)
        self._second = -1
        self._stamp = ""
        self._milli = -1
        self._ts = ""

    def _quote(self, value: str | None) -> str:
        """``value`` as a JSON string (null for None), or for text as is (``-`` for None; quoted if it must be)."""
        quoted = self._quoted.get(value)
        if quoted is None:
            if len(self._quoted) > 4096:  # caller-chosen values: keep the cache bounded
                self._quoted = {None: self._quoted[None]}
            if self._json:
                quoted = f'"{value}"' if _PLAIN(value) else json.dumps(value, ensure_ascii=False)  # type: ignore[arg-type]
            else:
                quoted = value if value and _PLAIN(value) else json.dumps(value, ensure_ascii=False)  # type: ignore[assignment]
            self._quoted[value] = quoted  # type: ignore[assignment]
        return quoted  # type: ignore[return-value]

    def _who(self, entry: Any) -> str:
        """The session, org, sandbox and pool fields of a line, kept by session: they repeat, so each
        combination is formatted once and found again with one lookup of a string whose hash is known (the
        identity's and the route's strings are the same objects request after request) and three ``is``
        (or ``==``) comparisons; no key tuple is built and hashed per line."""
        session, org, sandbox, pool = entry.session_id, entry.org_id, entry.sandbox_id, entry.pool
        kept = self._whos.get(session)
        if kept is not None and _same(kept[0], org) and _same(kept[1], sandbox) and _same(kept[2], pool):
            return kept[3]  # type: ignore[no-any-return]
        if len(self._whos) > 4096:
            self._whos = {}
        quote = self._quote
        if self._json:
            who = (f'"session_id":{quote(session)},"org_id":{quote(org)},"sandbox_id":{quote(sandbox)},'
                   f'"pool":{quote(pool)}')
        else:
            who = f"session_id={quote(session)} org_id={quote(org)} sandbox_id={quote(sandbox)} pool={quote(pool)}"
        self._whos[session] = (org, sandbox, pool, who)  # a session seen with another sandbox: the latest kept
        return who

    def _what(self, entry: Any) -> str:
        """The method, path and status fields of a line, kept by target as ``_who`` keeps its fields by
        session (the method and status compared, not hashed)."""
        method, target, status = entry.method, entry.target, entry.status
        kept = self._whats.get(target)
        if kept is not None and kept[1] == status and kept[0] == method:
            return kept[2]  # type: ignore[no-any-return]
        if len(self._whats) > 4096:
            self._whats = {}
        path = target if self.keep_query else target.partition("?")[0]
        path = self._quote(path)
        if self._json:
            what = f'"msg":"{method} {path[1:-1]} {status}","method":"{method}","path":{path},"status":{status}'
        else:
            what = f"{method} {path} {status}"
        self._whats[target] = (method, status, what)  # the latest method and status for a target kept
        return what

    def log(self, entry: Any) -> None:
        """``entry`` is a ``gateway.proxy.RequestLog`` (the gRPC front's calls are logged as one too)."""
        now = _time()
        what = self._what(entry)
        who = self._who(entry)
        upstream = entry.upstream
        code = entry.code or entry.error
        took = _hundredths(entry.duration)  # formatted in place (compiled: C integers, no str of its own)
        if self._json:
            milli = int(now * 1000)
            if milli != self._milli:  # many lines share a millisecond under load: format its stamp once
                self._milli, self._ts = milli, f"{milli // 1000}.{milli % 1000:03d}"  # integers: no float format
            up = "null" if upstream is None else _ms(upstream)
            error = "null" if code is None else f'"{code}"'
            line = (f'{{"ts":{self._ts},"level":"info","logger":"{ACCESS_LOGGER}",{what},"bytes_in":{entry.bytes_in},'
                    f'"bytes_out":{entry.bytes_out},"duration_ms":{took // 100}{_CENTS[took % 100]},"upstream_ms":{up},'
                    f'"request_id":"{entry.request_id}",{who},"protocol":"{entry.protocol}","error":{error}}}')
            if entry.trace_id is not None:
                line = f'{line[:-1]},"trace_id":"{entry.trace_id}"}}'

        else:
            second = int(now)
            if second != self._second:
                self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
            up = "-" if upstream is None else _ms(upstream)
            line = (f"{self._stamp} INFO    {ACCESS_LOGGER}: {what} bytes_in={entry.bytes_in} "
                    f"bytes_out={entry.bytes_out} duration_ms={took // 100}{_CENTS[took % 100]} upstream_ms={up} "
                    f"request_id={entry.request_id} {who} protocol={entry.protocol} error={code or '-'}")
            if entry.trace_id is not None:
                line = f"{line} trace_id={entry.trace_id}"
        pending = self._pending
        pending.append(line)
        if len(pending) >= self._max_pending:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            lines, self._pending = self._pending, []
            lines.append("")  # the last line's newline, without copying the batch once more
            try:
                self._stream.write("\n".join(lines))
                self._stream.flush()
            except (OSError, ValueError):  # stderr closed or gone: access lines are not worth a crash
                pass


def _same(a: str | None, b: str | None) -> bool:
    """Two fields of a line are the same value (most often the same object)."""
    return a is b or a == b


def _ms(seconds: float) -> str:
    """Seconds as milliseconds with two decimals (``1.23``): ``f"{seconds * 1000:.2f}"`` with halves
    rounded up, and no float formatting (compiled: C integers, about a tenth of the cost)."""
    hundredths = _hundredths(seconds)
    return f"{hundredths // 100}{_CENTS[hundredths % 100]}"


# ".00" to ".99": the fraction of a figure in milliseconds, taken from here (no padded integer formatted a line).
_CENTS = tuple(f".{cents:02d}" for cents in range(100))


def _hundredths(seconds: float) -> int:
    """Seconds in hundredths of a millisecond, halves rounded up (what ``_ms`` shows)."""
    return int(seconds * 100000.0 + 0.5) if seconds > 0.0 else 0


# Written without escaping: printable ASCII but space, quote and backslash.
_PLAIN = re.compile(r"[!#-\[\]-~]+").fullmatch


class FlushingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stderr handler for every other log line: writes the access lines still pending first, so a
    batch of access lines never lands after a line about something that happened later."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.access: AccessLog | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.access is not None:
            self.access.flush()
        super().emit(record)


ACCESS_LOGGER = "gateway.access"


def configure_logging(level: str, fmt: str, *, keep_query: bool = False) -> AccessLog | None:
    """Send log lines to stderr in the chosen format; returns the access log to write requests to
    (None when INFO lines are off; ``keep_query``: log paths with their query strings). The caller
    owns it: nothing here keeps it in a global but the root handler, which flushes it before each
    line of its own."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    stderr = threaded(sys.stderr)  # written by a thread: a slow reader of stderr never stops the loop
    handler = FlushingHandler(stderr)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's own access log would duplicate ours.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequestsAreInfo) for f in server_log.filters):
        server_log.addFilter(MalformedRequestsAreInfo())
    if not logging.getLogger(ACCESS_LOGGER).isEnabledFor(logging.INFO):
        return None
    access = handler.access = AccessLog(stderr, json_lines=use_json, keep_query=keep_query)
    atexit.register(access.flush)  # lines still pending when the process exits without stopping
    return access
