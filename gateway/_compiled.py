"""The compiled data plane: which modules Cython builds, and whether this process uses them.

The hot path (``gateway.proxy``'s protocols and per-request state, the access log, the request
metrics, the route cache's hit path, the gRPC front's connections, calls, streams, relay buffers and metrics) is plain Python that Cython can also compile, with ``.pxd``
files beside the modules declaring the classes as extension types (typed fields, C calls between
them). The ``.py`` files
stay the source and the fallback: ``pip install`` (``./scripts/serve``, ``./scripts/test``)
compiles them when Cython and a C compiler are there (``setup.py``) and installs them as they are
when not.

Which one a process runs is decided here, once, before any of them is imported: the compiled
modules when every one of them is built and the build's stamp (the digest of the sources it was
made from) matches the sources there are now, else all of them as Python (a compiled ``_upstream``
needs a compiled ``_exchange``: mixing is not possible, and a build older than an edited ``.py``
would run code that is no longer there). ``SANDBOX_GATEWAY_PURE_PYTHON=1``
forces Python; the test command runs the suite both ways. This is the one switch read from the
environment outside ``gateway.settings``: it must act before ``gateway.settings`` (or anything
else) is imported, and it chooses code, not configuration.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

PURE_PYTHON_ENV = "SANDBOX_GATEWAY_PURE_PYTHON"

# Dotted names; setup.py builds exactly these (it reads this tuple).
COMPILED_MODULES = (
    "gateway.proxy._exchange",
    "gateway.proxy._upstream",
    "gateway.proxy._framing",
    "gateway.proxy._state",
    "gateway.proxy._refusals",
    "gateway.proxy._keys",
    "gateway.proxy._request",
    "gateway.proxy._downstream",
    "gateway.proxy._plane",
    "gateway.proxy._wire",
    "gateway.proxy._admission",
    "gateway.logs",
    "gateway.metrics",
    "gateway.route_cache",
    "gateway.grpcfront.relay",
    "gateway.grpcfront.stream",
    "gateway.grpcfront.call",
    "gateway.grpcfront.head",
    "gateway.grpcfront.inbound",
    "gateway.grpcfront.connection",
    "gateway.grpcfront.headers",
    "gateway.grpcfront.frames",
    "gateway.grpcfront.front",
    "gateway.grpcfront.keeper",
    "gateway.grpcfront.upstream",
    "gateway.grpcfront.metrics",
    "gateway.grpcfront.host",
)

_ROOT = Path(__file__).resolve().parent.parent
STAMP = "gateway/_compiled.stamp"  # written by setup.py beside a complete build: the digest of its sources


def _paths(module: str, root: Path = _ROOT) -> tuple[Path, list[Path]]:
    """The module's .py, and its built extensions (any ABI tag)."""
    source = root.joinpath(*module.split(".")).with_suffix(".py")
    built = [source.with_name(source.stem + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    return source, [path for path in built if path.exists()]


def source_digest(root: Path = _ROOT) -> str:
    """A digest of everything the build is made from (each module's .py and .pxd)."""
    digest = hashlib.sha256()
    for module in COMPILED_MODULES:
        source = _paths(module, root)[0]
        for path in (source, source.with_suffix(".pxd")):
            if path.exists():
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _usable() -> str | None:
    """None when every compiled module is built, from the sources there are now, else why not."""
    for module in COMPILED_MODULES:
        if not _paths(module)[1]:
            return f"{module} is not compiled"
    stamp = _ROOT / STAMP
    if not stamp.exists() or stamp.read_text().strip() != source_digest():
        return "the build is older than the sources: reinstall to compile them"
    return None


class _PythonSources:
    """A meta path finder that loads the compiled modules from their .py files."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED_MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, _paths(fullname)[0])


COMPILED = False
DESCRIPTION = "not chosen yet"


def choose() -> None:
    """Decide, once per process (gateway/__init__.py), and set COMPILED and DESCRIPTION."""
    global COMPILED, DESCRIPTION
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        reason = f"{PURE_PYTHON_ENV} is set"
    else:
        reason = _usable()  # type: ignore[assignment]
        if reason is None:
            COMPILED, DESCRIPTION = True, "compiled (Cython)"
            return
    sys.meta_path.insert(0, _PythonSources())
    COMPILED, DESCRIPTION = False, f"pure Python ({reason})"
