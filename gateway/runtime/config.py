"""Per-app configuration, kept under one typed ``web.AppKey``.

Handlers live in several modules; reading one frozen object from the app
keeps them free of globals and lets tests build apps with different roots
side by side.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

#: The listen backlog of the runtime's sockets: the local provider listens with it, and the runtime
#: keeps it when it serves the inherited socket (asyncio's ``create_server(sock=...)``, under
#: aiohttp's ``SockSite`` and grpclib's ``Server.start``, calls ``listen()`` again with its own
#: default of 100-128). A Unix socket whose backlog is full fails a connect at once with EAGAIN
#: (no SYN retry as on TCP): a first-use burst of a thousand requests must fit.
LISTEN_BACKLOG = 1024

#: Output kept per stream (stdout, stderr) of one ``/execute`` call.
DEFAULT_MAX_OUTPUT_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class RuntimeConfig:
    """What every handler needs to know about this sandbox.

    ``root`` is already resolved (symlinks included), so confinement checks
    compare resolved paths against a resolved root.
    """

    root: Path
    sandbox_id: str
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    # Set on shutdown so endless streams (SSE with count=0) end promptly
    # instead of holding the process until the shutdown timeout.
    stopping: asyncio.Event = field(default_factory=asyncio.Event, compare=False)


CONFIG: web.AppKey[RuntimeConfig] = web.AppKey("runtime_config", RuntimeConfig)
