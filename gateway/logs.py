"""Logging: JSON lines for machines, plain text for a terminal.

``auto`` picks text when stderr is a terminal and JSON otherwise, so a
container's logs are structured without a flag. Fields passed with
``extra={"fields": {...}}`` become top-level JSON keys (the access log uses it).
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import time
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError


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
    """One line per data-plane request, in the format of the other log lines, written in batches.

    Not a ``logging.Logger``: a LogRecord and the JSON formatter cost about 35 µs per
    request, more than proxying it, and stderr is line-buffered (a write syscall per
    line). This formats the line directly, which is safe without JSON escaping because
    every field is a token (a generated or validated request ID, a sandbox ID, an HTTP
    method; pool names, which a policy may spell freely, are encoded once each), and
    keeps lines until ``flush``: the app flushes four times a second and when it stops.
    """

    def __init__(self, stream: Any, *, json_lines: bool, max_pending: int = 512) -> None:
        self._stream = stream
        self._json = json_lines
        self._pending: list[str] = []
        self._max_pending = max_pending
        self._pools: dict[str | None, str] = {None: "null"}
        self._second = -1
        self._stamp = ""

    def log(self, entry: Any) -> None:
        """``entry`` is a ``gateway.proxy.RequestLog``."""
        now = time.time()
        if self._json:
            pool = self._pools.get(entry.pool)
            if pool is None:
                pool = self._pools[entry.pool] = json.dumps(entry.pool, ensure_ascii=False)
            sandbox = "null" if entry.sandbox_id is None else f'"{entry.sandbox_id}"'
            line = (f'{{"ts":{now:.3f},"level":"info","logger":"{ACCESS_LOGGER}","msg":"{entry.method} '
                    f'{entry.status}","request_id":"{entry.request_id}","pool":{pool},"sandbox_id":{sandbox},'
                    f'"status":{entry.status},"duration_ms":{entry.duration * 1000:.2f},'
                    f'"protocol":"{entry.protocol}"}}')
        else:
            second = int(now)
            if second != self._second:
                self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
            line = (f"{self._stamp} INFO    {ACCESS_LOGGER}: {entry.method} {entry.status} "
                    f"request_id={entry.request_id} pool={entry.pool} sandbox_id={entry.sandbox_id} "
                    f"status={entry.status} duration_ms={entry.duration * 1000:.2f} protocol={entry.protocol}")
        pending = self._pending
        pending.append(line)
        if len(pending) >= self._max_pending:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            lines, self._pending = self._pending, []
            try:
                self._stream.write("\n".join(lines) + "\n")
                self._stream.flush()
            except (OSError, ValueError):  # stderr closed or gone: access lines are not worth a crash
                pass


ACCESS_LOGGER = "gateway.access"


def configure_logging(level: str, fmt: str) -> AccessLog | None:
    """Send log lines to stderr in the chosen format; returns the access log to write requests to
    (None when INFO lines are off). The caller owns it: nothing here keeps it in a global."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
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
    access = AccessLog(sys.stderr, json_lines=use_json)
    atexit.register(access.flush)  # lines still pending when the process exits without stopping
    return access
