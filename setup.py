"""The optional compiled data plane (see gateway/_compiled.py for what it is and how it is chosen).

Everything else about the package is in pyproject.toml. Here: compile the hot modules with
Cython when it can, and install them as plain Python when it cannot: without a C compiler, when
a module fails to compile, or with SANDBOX_GATEWAY_PURE_PYTHON=1 at install time. A failed build
never fails the install; it prints why and the gateway runs its pure-Python modules (gateway
then logs "pure Python" with the reason at startup).
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def compiled_modules() -> tuple:
    """gateway._compiled.COMPILED_MODULES, read without importing the package (no dependencies here)."""
    namespace: dict = {}
    source = (ROOT / "gateway" / "_compiled.py").read_text()
    exec(compile(source.split("_ROOT = ")[0], "gateway/_compiled.py", "exec"), namespace)
    return namespace["COMPILED_MODULES"]


def warn(message: str) -> None:
    print(f"setup: {message}; the gateway runs its pure-Python modules", file=sys.stderr)


def extensions() -> list:
    if os.environ.get("SANDBOX_GATEWAY_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        warn("Cython is not installed, so the data plane is not compiled")
        return []
    from setuptools import Extension
    modules = [Extension(name, [name.replace(".", "/") + ".py"]) for name in compiled_modules()]
    try:
        return cythonize(modules, language_level=3, quiet=True, build_dir="build/cython",
                         compiler_directives={"annotation_typing": False})
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
        try:
            super().run()
        except Exception as exc:
            warn(f"the compiled data plane could not be built ({exc})")

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            warn(f"{ext.name} could not be compiled ({exc})")


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
