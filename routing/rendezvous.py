"""Rendezvous (highest-random-weight) hashing of sandbox IDs onto hosts.

Every replica computes the same host for a sandbox ID with no coordination, and
a change to the host list moves only the IDs that must move: adding an (N+1)th
host takes about 1/(N+1) of the IDs and never moves an ID between two hosts that
were there before. xxh3 is fine here: sandbox IDs are already SHA-256 outputs,
so no caller can steer them onto a host.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash


class RendezvousRing:
    """Maps keys onto one of a fixed, non-empty list of hosts."""

    __slots__ = ("_hosts", "_seeds")

    def __init__(self, hosts: Sequence[str]) -> None:
        if not hosts:
            raise ValueError("a rendezvous ring needs at least one host")
        if len(set(hosts)) != len(hosts):
            raise ValueError("rendezvous hosts must be distinct")
        self._hosts = tuple(hosts)
        # One 64-bit seed per host, derived from its name, so the weight of
        # (key, host) is a single xxh3 call with no string concatenation.
        self._seeds = tuple(xxhash.xxh3_64_intdigest(h.encode()) for h in self._hosts)

    @property
    def hosts(self) -> tuple[str, ...]:
        return self._hosts

    def host_for(self, key: str) -> str:
        data = key.encode()
        best_index = 0
        best_weight = -1
        for index, seed in enumerate(self._seeds):
            weight = xxhash.xxh3_64_intdigest(data, seed)
            if weight > best_weight:
                best_index, best_weight = index, weight
        return self._hosts[best_index]
