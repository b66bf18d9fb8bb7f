"""Rendezvous hashing of sandbox IDs onto static hosts.

Every replica must agree with no coordination (same answer in another process,
whatever the host list's order), and a host-list change must move only the IDs
that have to move.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import xxhash

from routing import RendezvousRing, per_session_sandbox_id, shared_sandbox_id

REPO = Path(__file__).resolve().parents[1]
HOSTS = [f"http://10.0.0.{i}:8888" for i in range(1, 11)]


def keys(n: int, tag: str = "s") -> list[str]:
    """Realistic keys: sandbox IDs (what the static provider hashes)."""
    return [per_session_sandbox_id(f"{tag}-{i}") for i in range(n)]


KEYS_20K = keys(20_000)


def reference_host_for(hosts: list[str], key: str) -> str:
    """The algorithm, spelled out: highest xxh3_64(key, seed=xxh3_64(host)) wins."""
    return max(hosts, key=lambda h: xxhash.xxh3_64_intdigest(key.encode(), xxhash.xxh3_64_intdigest(h.encode())))


def test_matches_the_reference_algorithm() -> None:
    ring = RendezvousRing(HOSTS)
    for key in KEYS_20K[:1000]:
        assert ring.host_for(key) == reference_host_for(HOSTS, key)


@pytest.mark.parametrize(
    ("key", "host"),
    [
        pytest.param("ses-51256c9fcd04ef0144d0afcdfb9ffb2abc280ff2e0bae370", "http://10.0.0.4:8888", id="ses vector"),
        pytest.param("org-af3bd288e383e28dca86f85c8a3b604bced4023b4c00f150", "http://10.0.0.2:8888", id="org vector"),
        pytest.param("org-id__user-id", "http://10.0.0.1:8888", id="legacy"),
        pytest.param(per_session_sandbox_id("s1"), "http://10.0.0.3:8888", id="ses s1"),
        pytest.param(shared_sandbox_id(None, "u"), "http://10.0.0.3:8888", id="usr u"),
    ],
)
def test_golden_values(key: str, host: str) -> None:
    """Pinned: a change of hash or seeding would move every live static-pool sandbox on upgrade."""
    assert RendezvousRing(HOSTS[:5]).host_for(key) == host


SUBPROCESS_SCRIPT = """
import json, sys
from routing import RendezvousRing, per_session_sandbox_id
hosts = json.loads(sys.argv[1])
ring = RendezvousRing(hosts)
print(json.dumps([ring.host_for(per_session_sandbox_id(f"s-{i}")) for i in range(1000)]))
"""


def test_deterministic_across_processes() -> None:
    ring = RendezvousRing(HOSTS)
    expected = [ring.host_for(key) for key in KEYS_20K[:1000]]
    # A different hash seed in the child: nothing may depend on Python's str hash.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", SUBPROCESS_SCRIPT, json.dumps(HOSTS)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert json.loads(result.stdout) == expected


def test_host_order_does_not_matter() -> None:
    forward = RendezvousRing(HOSTS)
    backward = RendezvousRing(list(reversed(HOSTS)))
    assert all(forward.host_for(k) == backward.host_for(k) for k in KEYS_20K[:5000])


def test_adding_a_host_moves_about_one_in_n_plus_one_and_only_to_the_new_host() -> None:
    old = RendezvousRing(HOSTS)
    new_host = "http://10.0.0.11:8888"
    new = RendezvousRing([*HOSTS, new_host])
    moved = [(old.host_for(k), new.host_for(k)) for k in KEYS_20K]
    moved = [(a, b) for a, b in moved if a != b]
    fraction = len(moved) / len(KEYS_20K)
    assert 0.07 <= fraction <= 0.12, fraction  # ideal: 1/11 = 0.0909
    assert all(b == new_host for _, b in moved), "an ID moved between two old hosts"
    # The new host's share comes from every old host, not from one neighbour.
    assert len({a for a, _ in moved}) == len(HOSTS)


def test_removing_a_host_moves_only_its_ids() -> None:
    old = RendezvousRing(HOSTS)
    removed = HOSTS[3]
    new = RendezvousRing([h for h in HOSTS if h != removed])
    orphans = []
    for key in KEYS_20K:
        before, after = old.host_for(key), new.host_for(key)
        if before == removed:
            assert after != removed
            orphans.append(after)
        else:
            assert after == before, key
    # The removed host's IDs spread over all the others.
    assert set(orphans) == set(HOSTS) - {removed}
    assert 0.07 <= len(orphans) / len(KEYS_20K) <= 0.13


BALANCE_SAMPLES = {
    "ses IDs": lambda: KEYS_20K,
    "org IDs": lambda: [shared_sandbox_id(f"org-{i}", "u") for i in range(20_000)],
    "legacy IDs": lambda: [f"org-{i}__user-{i}" for i in range(20_000)],
}


@pytest.mark.parametrize("kind", list(BALANCE_SAMPLES))
def test_reasonably_balanced(kind: str) -> None:
    ring = RendezvousRing(HOSTS)
    sample = BALANCE_SAMPLES[kind]()
    counts = Counter(ring.host_for(k) for k in sample)
    assert set(counts) == set(HOSTS)
    for host, count in counts.items():
        assert 0.07 <= count / len(sample) <= 0.13, (host, count)


def test_single_host_takes_everything() -> None:
    ring = RendezvousRing(["http://only:1"])
    assert {ring.host_for(k) for k in KEYS_20K[:100]} == {"http://only:1"}


def test_hosts_property_keeps_the_given_order() -> None:
    assert RendezvousRing(HOSTS).hosts == tuple(HOSTS)
    assert RendezvousRing(["b", "a"]).hosts == ("b", "a")


def test_unicode_keys() -> None:
    ring = RendezvousRing(HOSTS)
    assert ring.host_for("org-日本__user") == ring.host_for("org-日本__user")


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        pytest.param([], "at least one host", id="empty list"),
        pytest.param((), "at least one host", id="empty tuple"),
        pytest.param(["a", "b", "a"], "distinct", id="duplicate"),
        pytest.param(["http://h:1", "http://h:1"], "distinct", id="duplicate URL"),
    ],
)
def test_invalid_host_lists(hosts: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RendezvousRing(hosts)
