"""The cyclic GC while serving: thresholds, and young collections paced by the clock (issue 28).

Every collection is a loop turn in which no connection is served, and its cost grows with the objects it
walks (about half a microsecond each on the 2-core VM). CPython triggers one when the young generation's
count (allocations minus deallocations of tracked objects) passes its threshold (700). Under a connection
attack that count stands still: each connection closed frees about 19 tracked objects, each reconnect
allocates as many, so the young generation grew to 15,000-35,000 objects before a collection came, and
the middle one to 20,000 (grpc-idle: 2,000 idle gRPC connections closed at their deadline and reopened,
about 1,300 a second; young collections of up to 9 ms, middle ones of up to 20 ms, in one loop turn, seen
with ``gc.callbacks`` and ``gc.get_objects`` in the gateway). :class:`PacedCollections` also collects the
young generation every YOUNG_EVERY seconds, and the middle one every MIDDLE_EVERY of those, so what each
walks is bounded by what a connection churn allocates in that time, not by when the count happens to move.
At rest the young generation is nearly empty and a collection of it costs some 20 us.
"""

from __future__ import annotations

import asyncio
import gc

# Young collections per collection of the middle generation (CPython's default: 10), and of the middle per
# full one (CPython's default: 10). Full collections walk every live object (about 40 per gRPC connection);
# with the connections' own cycles broken at close (tests/test_no_cycles.py) they find almost nothing, and
# under 4,000 idle gRPC connections closed and reopened each took 80-145 ms, one every ~10 s at the default.
# The paced collections below make a middle one at least 10 times a second, so a full collection (which also
# waits until the objects promoted since the last are a quarter of those it would walk) comes at most once per
# FULL_COLLECTION_EVERY / 10 seconds: about 5 minutes. At 333 (one per ~33 s at that rate) one fell in a victim
# window under slowloris: 23 ms of CPU in one loop turn.
MIDDLE_COLLECTION_EVERY = 3
FULL_COLLECTION_EVERY = 3_000
YOUNG_EVERY = 0.025  # seconds between paced young collections
MIDDLE_EVERY = 4     # paced young collections per paced middle one


def tune_gc() -> None:
    """``serve``'s thresholds (after ``gc.freeze()``): a middle collection every 3 young ones keeps each
    small, a full one per 3,000 middle ones keeps those rare."""
    young, _, _ = gc.get_threshold()
    gc.set_threshold(young, MIDDLE_COLLECTION_EVERY, FULL_COLLECTION_EVERY)


class PacedCollections:
    """Collect the young generation every ``every`` seconds on ``loop`` (the middle one every MIDDLE_EVERY
    times), besides CPython's own collections, until :meth:`stop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float = YOUNG_EVERY) -> None:
        self.loop = loop
        self.every = every
        self.runs = 0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._timer = self.loop.call_later(self.every, self._collect)

    def _collect(self) -> None:
        self.runs += 1
        gc.collect(1 if self.runs % MIDDLE_EVERY == 0 else 0)
        self._timer = self.loop.call_later(self.every, self._collect)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
