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
