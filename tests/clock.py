"""The one fake clock of the tests: injected as ``clock=`` wherever code reads the time (nothing is
monkeypatched). A test moves it by hand: ``clock.advance(61)`` (or ``clock.now = ...``)."""

from __future__ import annotations

T0 = 1_700_000_000.0


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
