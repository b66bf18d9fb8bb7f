"""The chaos suite in CI: 3 replicas, Redis, local and fake-Kubernetes sandboxes under steady load
while replicas, Redis, sandboxes and watches fail (tests/chaos/scenario.py). The zeros are the
contract: nothing given to the wrong owner, lost, duplicated or leaked, and every error one a fault
explains, inside its window. benchmarks/soak.py runs the same scenario longer and bigger."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenario import Scale, run
from tests.redis_server import redis_server_path

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def short_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chaos")


async def test_chaos_run_keeps_the_zeros(short_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    report = await run(short_root, Scale())
    with capsys.disabled():  # the report belongs in the CI log, passed or not
        print("\n" + report.render())
    assert report.errors_unexpected == [], report.render()
    assert report.wrong_owner == 0, report.render()
    assert report.sessions_lost == 0, report.render()
    assert report.bindings_lost["Redis SIGKILLed, back from its AOF"] == 0, report.render()
    assert report.duplicated == [], report.render()
    assert report.leaked == [], report.render()
    assert report.ok > report.requests // 2, report.render()  # the load really ran, and mostly succeeded
