"""A read of the Redis store whose answer came too late is sent once more; a write never is."""

from __future__ import annotations

from typing import Any

import pytest
from redis import exceptions as redis_errors

from gateway.store.redis import _read_again_on_timeout


class LateScript:
    """A registered script that times out ``late`` times, then answers."""

    def __init__(self, late: int) -> None:
        self.late = late
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, **call: Any) -> str:
        self.calls.append(call)
        if len(self.calls) <= self.late:
            raise redis_errors.TimeoutError("Timeout reading from socket")
        return "answer"


async def test_a_late_read_is_sent_once_more():
    script = LateScript(late=1)
    assert await _read_again_on_timeout(script, keys=["k"], args=["s"]) == "answer"
    assert script.calls == [{"keys": ["k"], "args": ["s"]}] * 2


async def test_a_read_late_twice_fails_as_it_did():
    script = LateScript(late=2)
    with pytest.raises(redis_errors.TimeoutError):
        await _read_again_on_timeout(script, keys=["k"])
    assert len(script.calls) == 2
