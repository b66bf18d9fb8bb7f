"""Logging: JSON lines for machines, plain text for a terminal.

``auto`` picks text when stderr is a terminal and JSON otherwise, so a
container's logs are structured without a flag. Fields passed with
``extra={"fields": {...}}`` become top-level JSON keys (the access log uses it).
"""

from __future__ import annotations

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


def configure_logging(level: str, fmt: str) -> None:
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
