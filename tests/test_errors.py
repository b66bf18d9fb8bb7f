"""Every error the gateway reports has a 4xx/5xx status, a snake_case code and the documented body."""

from __future__ import annotations

import json
import re

import pytest

from gateway import errors


def all_subclasses(cls: type) -> list[type]:
    """The public tree: the subclasses declared in gateway/errors.py (a provider's own control-flow
    subclasses, such as the Kubernetes provider's ObjectMissing, are its business and inherit all)."""
    found = []
    for sub in cls.__subclasses__():
        found += [sub] if sub.__module__ == errors.__name__ else []
        found += all_subclasses(sub)
    return found


@pytest.mark.parametrize("cls", all_subclasses(errors.GatewayError), ids=lambda c: c.__name__)
def test_every_error_has_a_status_code_and_body(cls):
    exc = cls("what went wrong and how to fix it", **({"scope": "pool"} if cls is errors.CapacityExceeded else {}))
    assert 400 <= exc.status < 600 and exc.status != 500
    assert re.fullmatch(r"[a-z]+(_[a-z]+)*", exc.code)
    assert json.loads(errors.error_body(exc)) == {"error": {"code": exc.code, "message": exc.message}}
    assert cls.__name__ in errors.__doc__  # the tree in the module docstring stays complete


def test_retry_after_is_whole_seconds():
    assert errors.CapacityExceeded("full", scope="org", retry_after=0.2).headers() == {"Retry-After": "1"}
    assert errors.StoreUnavailable("down", retry_after=7.6).headers() == {"Retry-After": "8"}
