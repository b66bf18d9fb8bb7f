"""One admission, one set of header rules: identity, credential and X-Sandbox-* names are named (and so
filtered) in gateway/proxy/_admission.py only, for the HTTP data plane and the gRPC front alike.

A grep-level check, by the syntax tree: no other module of the request paths (gateway/proxy, gateway/grpcfront)
has a string or bytes constant that is one of those names, in any spelling (case, ``-`` or ``_``). A second
copy of a rule is how the gRPC front came to forward ``Authorization`` in capitals (issue #29): a module that
needs one of these names takes it, or its role, from the admission.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gateway.proxy._admission import (R_AUTH, R_BOT, R_DROP, R_ORG, R_PASS, R_SANDBOX_ID, R_XFF, REQUEST_HEADERS,
                                      header_role)

ROOT = Path(__file__).resolve().parent.parent / "gateway"
RULES = ROOT / "proxy" / "_admission.py"
SCANNED = sorted([*(ROOT / "proxy").glob("*.py"), *(ROOT / "grpcfront").glob("*.py")])
GUARDED = re.compile(r"x[-_](org|user|session|bot)[-_]id|(proxy[-_])?authorization|x[-_]sandbox[-_][a-z0-9_-]*")


def named_headers(path: Path) -> list[tuple[int, str]]:
    """The string and bytes constants of ``path`` that are, whole, a guarded header name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            if GUARDED.fullmatch(text.lower()):
                found.append((node.lineno, text))
    return found


def test_identity_credential_and_sandbox_names_are_named_in_the_admission_only():
    assert RULES in SCANNED and len(SCANNED) > 15
    elsewhere = {str(path.relative_to(ROOT)): hits for path in SCANNED if path != RULES
                 if (hits := named_headers(path))}
    assert not elsewhere, f"header names the admission's rules own, named elsewhere: {elsewhere}"
    assert len(named_headers(RULES)) > 20  # the check reads what it means to


def test_the_rules_classify_every_spelling_case_insensitively_once_lower_cased():
    for name in (b"X-Org-Id", b"X-USER-ID", b"x-Session-Id", b"X-Bot-ID", b"AUTHORIZATION", b"Proxy-Authorization"):
        assert header_role(name.lower()) in (R_DROP, R_AUTH) or R_ORG <= header_role(name.lower()) <= R_BOT, name
    for name in (b"X-Sandbox-Id", b"X-Sandbox-Pod-IP", b"x_sandbox_id", b"X_Org_Id", b"X-Forwarded-For"):
        assert header_role(name.lower()) not in (R_PASS,), name
    assert header_role(b"x-sandbox-id") == R_SANDBOX_ID and header_role(b"x-forwarded-for") == R_XFF
    assert header_role(b"x-custom") == R_PASS and all(name == name.lower() for name in REQUEST_HEADERS)
