"""The optional compiled data plane (see gateway/_compiled.py for what it is and how it is chosen).

Everything else about the package is in pyproject.toml. Here: compile the hot modules with
Cython when it can, and install them as plain Python when it cannot: without a C compiler, when
a module fails to compile, or with SANDBOX_GATEWAY_PURE_PYTHON=1 at install time. A failed build
never fails the install; it prints why and the gateway runs its pure-Python modules (gateway
then logs "pure Python" with the reason at startup).
"""

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _load_compiled():
    """gateway/_compiled.py, loaded without importing the package (whose dependencies are not here)."""
    spec = importlib.util.spec_from_file_location("_sandbox_gateway_compiled", ROOT / "gateway" / "_compiled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compiled = _load_compiled()


def warn(message: str) -> None:
    print(f"setup: {message}; the gateway runs its pure-Python modules", file=sys.stderr)


def cython_cache() -> str | bool:
    """Where Cython keeps its translations between builds (a fresh checkout need not translate again):
    CYTHON_CACHE_DIR or ~/.cython. Each is filed under a digest of the module's source, its .pxd and
    other dependencies, the directives and Cython's version, so a changed source is translated anew.
    False (no cache) when the directory cannot be made."""
    path = Path(os.environ.get("CYTHON_CACHE_DIR") or Path.home() / ".cython") / "compiler"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return str(path)


def extensions() -> list:
    if os.environ.get(compiled.PURE_PYTHON_ENV, "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        warn("Cython is not installed, so the data plane is not compiled")
        return []
    from setuptools import Extension
    # -g0: no debug sections (they make the installed modules about six times larger).
    modules = [Extension(name, [name.replace(".", "/") + ".py"], extra_compile_args=["-g0"])
               for name in compiled.COMPILED_MODULES]
    # nthreads: the translation to C runs one module per core too (the C compile already does).
    options = {"language_level": 3, "quiet": True, "build_dir": "build/cython", "nthreads": os.cpu_count() or 1,
               "compiler_directives": {"annotation_typing": False}}
    cache = cython_cache()
    if cache:
        try:
            return cythonize(modules, cache=cache, **options)
        except Exception:  # a compile error, or another build writing the same cache entry: again without it
            pass
    try:
        return cythonize(modules, **options)
    except Exception as exc:  # a Cython compile error: report, install as Python
        warn(f"Cython could not compile the data plane ({exc})")
        return []


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: a missing compiler or a failed module leaves Python."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1  # a dozen modules: about half the time on two cores

    def run(self) -> None:
        self.failed = False
        try:
            super().run()
        except Exception as exc:
            self.failed = True
            warn(f"the compiled data plane could not be built ({exc})")
        if self.extensions and not self.failed:
            # The stamp says "this build is whole, and made from these sources" (gateway/_compiled.py).
            stamp = Path(ROOT if self.inplace else self.build_lib) / compiled.STAMP
            stamp.write_text(compiled.source_digest(ROOT) + "\n")

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self.failed = True
            warn(f"{ext.name} could not be compiled ({exc})")


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
