"""``serve --workers auto``: one worker per usable core with a shared store, one without."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import Settings
from tests.gateway_process import GatewayProcess


@pytest.mark.parametrize(("workers", "redis_url", "expected"), [
    pytest.param("auto", "redis://127.0.0.1:1", len(os.sched_getaffinity(0)), id="auto with Redis: one per core"),
    pytest.param("auto", None, 1, id="auto without Redis: the memory store is one process's"),
    pytest.param(" Auto ", "redis://127.0.0.1:1", len(os.sched_getaffinity(0)), id="spelling is forgiving"),
    pytest.param("3", "redis://127.0.0.1:1", 3, id="a number from the environment"),
    pytest.param(2, None, 2, id="a number stays a number (serve refuses it without Redis)"),
])
def test_worker_count(workers: object, redis_url: str | None, expected: int) -> None:
    assert Settings(workers=workers, redis_url=redis_url).worker_count == expected


@pytest.mark.parametrize("workers", ["0", "65", "lots", 1.5])
def test_bad_worker_counts_name_the_setting_and_the_choices(workers: object) -> None:
    with pytest.raises(ValidationError, match=r"workers[\s\S]*from 1 to 64, or 'auto'"):
        Settings(workers=workers)


async def test_serve_workers_auto_says_what_it_chose(tmp_path: Path) -> None:
    process = await GatewayProcess(tmp_path / "gw", "--workers", "auto").start()
    try:
        assert any("workers: auto -> 1 (the memory store is one process's" in line for line in process.log)
    finally:
        assert await process.stop() == 0
