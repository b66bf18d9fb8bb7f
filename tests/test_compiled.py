"""The compiled data plane and its pure-Python fallback (gateway/_compiled.py, setup.py).

The suite itself runs both ways (scripts/test); these check the switch: that the way the test
command asked for is the way that runs, that SANDBOX_GATEWAY_PURE_PYTHON forces Python, that a
build older than its sources or missing a module is never used, and that an install without a C
compiler still installs a gateway that works.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gateway import _compiled

ROOT = Path(__file__).resolve().parent.parent
PROBE = ("import gateway._compiled as c, gateway.proxy._downstream as d; "
         "print(c.COMPILED, d.__file__, c.DESCRIPTION, sep='\\n')")


def probe(cwd: Path, **env: str) -> tuple[bool, str, str]:
    """(compiled?, the file _downstream came from, the description) in a fresh interpreter at ``cwd``."""
    environ = {**os.environ, **env}
    environ.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=environ, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return out[0] == "True", out[1], out[2]


def test_the_way_the_test_command_asked_for_is_the_way_that_runs() -> None:
    asked = os.environ.get(_compiled.PURE_PYTHON_ENV)
    if asked == "0":  # scripts/test sets this only when the build is usable
        assert _compiled.COMPILED, _compiled.DESCRIPTION
    elif asked == "1":
        assert not _compiled.COMPILED
    for module in _compiled.COMPILED_MODULES:
        path = importlib.import_module(module).__file__
        assert path is not None
        assert path.endswith(".py") != _compiled.COMPILED, (module, path)


def test_the_environment_forces_pure_python() -> None:
    compiled, path, description = probe(ROOT, SANDBOX_GATEWAY_PURE_PYTHON="1")
    assert not compiled and path.endswith("/gateway/proxy/_downstream.py")
    assert description == "pure Python (SANDBOX_GATEWAY_PURE_PYTHON is set)"


def _package_with_fake_build(tmp_path: Path, stamp: str) -> Path:
    """A copy of the package whose compiled modules have (empty, never loaded) builds, stamped ``stamp``."""
    shutil.copytree(ROOT / "gateway", tmp_path / "gateway", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(ROOT / "routing", tmp_path / "routing", ignore=shutil.ignore_patterns("__pycache__"))
    for module in _compiled.COMPILED_MODULES:
        source = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
        source.with_name(source.stem + importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"")
    (tmp_path / _compiled.STAMP).write_text(stamp + "\n")
    return tmp_path


def test_a_build_from_other_sources_is_not_used(tmp_path: Path) -> None:
    root = _package_with_fake_build(tmp_path, _compiled.source_digest(ROOT))
    with (root / "gateway" / "proxy" / "_wire.py").open("a") as wire:
        wire.write("# edited after the build\n")
    compiled, path, description = probe(root, SANDBOX_GATEWAY_PURE_PYTHON="")
    assert not compiled and path == str(root / "gateway" / "proxy" / "_downstream.py")
    assert description == "pure Python (the build is older than the sources: reinstall to compile them)"


def test_a_build_missing_one_module_is_not_used(tmp_path: Path) -> None:
    root = _package_with_fake_build(tmp_path, _compiled.source_digest(ROOT))
    next(root.glob("gateway/metrics*" + importlib.machinery.EXTENSION_SUFFIXES[0])).unlink()
    compiled, path, description = probe(root, SANDBOX_GATEWAY_PURE_PYTHON="")
    assert not compiled and path.endswith("/gateway/proxy/_downstream.py")
    assert description == "pure Python (gateway.metrics is not compiled)"


@pytest.mark.slow
def test_without_a_c_compiler_the_install_is_pure_python(tmp_path: Path) -> None:
    """pip builds the wheel (Cython translates; the compiler is /bin/false): it succeeds, says why
    there is no compiled data plane, and holds the Python modules only."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.so", "__pycache__", ".pytest_cache", ".hypothesis", ".sandbox-gateway"))
    env = {**os.environ, "CC": "/bin/false", "LDSHARED": "/bin/false"}
    env.pop("SANDBOX_GATEWAY_PURE_PYTHON", None)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path / "dist"),
                             str(source)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "could not be compiled" in result.stdout + result.stderr
    wheel = next((tmp_path / "dist").glob("sandbox_gateway-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "gateway/proxy/_downstream.py" in names and "gateway/_compiled.py" in names
    assert not [name for name in names if name.endswith(".so")]
