"""Log output: the hand-formatted access log."""

from __future__ import annotations

import io
import json

from gateway.logs import AccessLog
from gateway.proxy import RequestLog


def test_access_log_json_lines_parse_and_batch():
    """The access log formats its JSON by hand (no LogRecord): every line must still be valid JSON,
    with a pool name that needs escaping and absent fields as null; nothing is written before flush."""
    out = io.StringIO()
    access = AccessLog(out, json_lines=True)
    access.log(RequestLog("GET", 'po"ol\\\n', "ses-abc", 200, 0.0012345, 0, 5, "sse", "rid-1", None))
    access.log(RequestLog("POST", None, None, 400, 0.0001, 0, 0, "http", "rid-2", None))
    assert out.getvalue() == ""
    access.flush()
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["pool"] == 'po"ol\\\n' and first["sandbox_id"] == "ses-abc" and first["duration_ms"] == 1.23
    assert first["msg"] == "GET 200" and first["protocol"] == "sse" and first["logger"] == "gateway.access"
    assert second["pool"] is None and second["sandbox_id"] is None and second["status"] == 400
