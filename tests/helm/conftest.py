"""Fixtures of the Helm chart tests: the chart, loaded once for the package, and each built-in scenario rendered.

Where ``helm_python`` or ``kubernetes_validate`` cannot load, importing the harness skips (printing
why); every test module here imports it too and is skipped with that reason, so no fixture is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

try:
    from tests.helm import harness
except pytest.skip.Exception:
    harness = None

if harness is not None:
    @pytest.fixture(scope="package")
    def chart() -> Iterator[Any]:
        try:
            loaded = harness.helm_python.Chart.load(str(harness.CHART))
        except Exception as exc:  # the native library may fail to load on an unsupported platform
            reason = f"helm_python cannot load charts here: {exc!r}"
            print(reason)
            pytest.skip(reason)
        with loaded:
            yield loaded

    @pytest.fixture(params=sorted(harness.SCENARIOS))
    def scenario(request: pytest.FixtureRequest, chart: Any) -> Any:
        return harness.render(chart, harness.SCENARIOS[request.param]())
