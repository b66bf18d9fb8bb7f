"""Sets of TCP ports as a policy and a sandbox access token write them: ``[8888, "3000-3999"]``.

Pure: a pool's ``ports`` (which ports of its sandboxes the data plane may reach) and an access
token's ``ports`` claim (which of those one token opens) are both a :class:`PortSet`. It keeps
merged, sorted ranges, so a range of a thousand ports costs two integers, not a thousand.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_MAX_ITEMS = 64  # ports entries in a policy or a token: a list, not an enumeration of ports


class PortSet:
    """An immutable set of TCP ports (1-65535) held as merged ``(low, high)`` ranges."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: Iterable[tuple[int, int]]) -> None:
        merged: list[tuple[int, int]] = []
        for low, high in sorted(ranges):
            if merged and low <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        self.ranges = tuple(merged)

    @classmethod
    def single(cls, port: int) -> PortSet:
        return cls(((port, port),))

    @classmethod
    def parse(cls, items: Any) -> PortSet:
        """From a list of port numbers and ``"low-high"`` strings; ``ValueError`` names the bad item."""
        if not isinstance(items, list | tuple) or not items:
            raise ValueError("must be a non-empty list of ports and 'low-high' ranges, e.g. [8888, \"3000-3999\"]")
        if len(items) > _MAX_ITEMS:
            raise ValueError(f"at most {_MAX_ITEMS} entries (use ranges)")
        return cls(_one(item) for item in items)

    def __contains__(self, port: object) -> bool:
        for low, high in self.ranges:
            if low <= port <= high:  # type: ignore[operator]
                return True
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PortSet) and other.ranges == self.ranges

    def __hash__(self) -> int:
        return hash(self.ranges)

    def issubset(self, other: PortSet) -> bool:
        return all(any(lo >= olo and hi <= ohi for olo, ohi in other.ranges) for lo, hi in self.ranges)

    def to_list(self) -> list[int | str]:
        """The policy's (and the token claim's) own notation: ``[8888, "3000-3999"]``."""
        return [low if low == high else f"{low}-{high}" for low, high in self.ranges]

    def describe(self) -> str:
        """For error messages: ``8888, 3000-3999``."""
        return ", ".join(str(item) for item in self.to_list())

    def __repr__(self) -> str:
        return f"PortSet({self.to_list()!r})"


def _one(item: Any) -> tuple[int, int]:
    if isinstance(item, bool):
        raise ValueError(f"{item!r} is not a port")
    if isinstance(item, int):
        low = high = item
    elif isinstance(item, str):
        first, dash, last = item.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or len(first) > 5 or len(last) > 5:
            raise ValueError(f"{item!r} is not a port or a 'low-high' range")
        low, high = int(first), int(last) if dash else int(first)
    else:
        raise ValueError(f"{item!r} is not a port or a 'low-high' range")
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"{item!r}: ports are 1-65535, low before high")
    return low, high


__all__ = ["PortSet"]
