"""Each compiled class's ``.pxd`` declares exactly the fields its Python class has, and the reverse.

The data plane's hot modules (gateway/_compiled.py) are plain Python, compiled by Cython where a C
compiler is found; a ``.pxd`` beside a module declares its classes' fields as C struct members. A field
added to a class's ``__slots__`` (or, for a class without them, its annotations) but not to its
``.pxd`` fails only in the compiled build (an AttributeError at run time), and one left in the
``.pxd`` after the class dropped it wastes a slot silently. This test reads both with no compiler
involved, so the pure-Python run of the suite catches a drift too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gateway import _compiled

ROOT = Path(__file__).resolve().parent.parent
_CLASS = re.compile(r"^cdef class (\w+)")
_BASE = re.compile(r"^cdef class (\w+)\((\w+)\)", re.M)
_FIELD = re.compile(r"^\s+cdef (?:public |readonly )?[\w.]+(?: [\w.]+)*? ((?:\w+)(?:, \w+)*)\s*$")


def pxd_fields(path: Path) -> dict[str, set[str]]:
    """``{class: field names}`` of the ``cdef class`` blocks in a ``.pxd`` (methods are not fields)."""
    classes: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].rstrip()
        match = _CLASS.match(line)
        if match:
            current = classes.setdefault(match.group(1), set())
            continue
        if current is None or not line.strip() or line.strip() == "pass" or "(" in line or ")" in line:
            continue  # a method (cpdef/cdef with arguments), its decorator (@cython.locals, even over lines), or nothing
        field = _FIELD.match(line)
        assert field, f"{path.name}: cannot read {line!r}"
        # an instance dict (cdef dict __dict__) is not a field
        current.update(name.strip() for name in field.group(1).split(",") if name.strip() != "__dict__")
    return classes


def pxd_bases(path: Path) -> dict[str, str]:
    """``{class: the class it extends}`` of the ``cdef class Name(Base)`` blocks in a ``.pxd``."""
    return dict(_BASE.findall(path.read_text(encoding="utf-8")))


def python_fields(path: Path, name: str) -> set[str]:
    """The fields of class ``name`` in ``path``: its ``__slots__``; without them, its annotated names and
    the ``self.<field>`` its methods assign."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            fields: set[str] = set()
            for item in node.body:
                if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                        for t in item.targets):
                    return set(ast.literal_eval(item.value))
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    fields.add(item.target.id)
                if isinstance(item, ast.FunctionDef):
                    fields |= {target.attr for statement in ast.walk(item)
                               for target in getattr(statement, "targets", [getattr(statement, "target", None)])
                               if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                               and target.value.id == "self"}
            return fields
    raise AssertionError(f"{path.name} has no class {name}")


def _declared() -> list[tuple[Path, str]]:
    pairs = []
    for module in _compiled.COMPILED_MODULES:
        pxd = ROOT / (module.replace(".", "/") + ".pxd")
        if pxd.exists():
            pairs += [(pxd, name) for name in pxd_fields(pxd)]
    return pairs


def _inherited(pxd: Path, name: str) -> set[str]:
    """The fields ``name`` gets from the compiled class it extends (and that one's), declared in their ``.pxd``."""
    base = pxd_bases(pxd).get(name)
    if base is None:
        return set()
    for path, declared in _declared():
        if declared == base:
            return pxd_fields(path)[base] | _inherited(path, base)
    raise AssertionError(f"{pxd.name}: {name} extends {base}, which no compiled module's .pxd declares")


@pytest.mark.parametrize(("pxd", "name"), [pytest.param(p, n, id=f"{p.stem}.{n}") for p, n in _declared()])
def test_the_pxd_declares_exactly_the_class_fields(pxd: Path, name: str):
    """A class that extends another (Connection, FrameReader) declares only its own fields; the ones it sets
    that its base declares are the base's."""
    declared = pxd_fields(pxd)[name]
    inherited = _inherited(pxd, name)
    fields = python_fields(pxd.with_suffix(".py"), name)
    assert declared - fields == set(), f"{pxd.name} declares fields {name} does not have"
    assert declared & inherited == set(), f"{pxd.name} declares again fields {name} inherits"
    assert fields - declared - inherited == set(), \
        f"{name} has fields {pxd.name} does not declare (the compiled build fails)"


def test_the_reader_sees_a_drift(tmp_path: Path):
    """The check is real: a field on one side only is found, either way."""
    (tmp_path / "m.pxd").write_text("cdef class C:\n    cdef public object a, b\n    cdef public int n\n"
                                    "    cpdef go(self, int x)\n")
    (tmp_path / "m.py").write_text("class C:\n    __slots__ = ('a', 'b', 'n', 'extra')\n")
    assert pxd_fields(tmp_path / "m.pxd") == {"C": {"a", "b", "n"}}
    assert python_fields(tmp_path / "m.py", "C") - pxd_fields(tmp_path / "m.pxd")["C"] == {"extra"}
    (tmp_path / "d.pxd").write_text("cdef class D(C):\n    cdef public object own\n"
                                    "    @cython.locals(i=Py_ssize_t,\n                   j=int)\n    cpdef go(self)\n")
    assert pxd_fields(tmp_path / "d.pxd") == {"D": {"own"}} and pxd_bases(tmp_path / "d.pxd") == {"D": "C"}
    (tmp_path / "e.pxd").write_text("cdef class E:\n    cdef dict __dict__\n    cdef public object own\n")
    assert pxd_fields(tmp_path / "e.pxd") == {"E": {"own"}}  # an instance dict is not a field


def test_every_compiled_class_is_checked():
    assert {name for _, name in _declared()} >= {"Exchange", "RequestLog", "PlaneState", "ClientState", "Stream",
                                                 "RelayBuffer", "Call", "_Side", "FrameReader", "Connection"}
