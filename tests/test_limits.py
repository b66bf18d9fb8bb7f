"""Per-org request-rate and stream limits (pure; the data plane's use is tested with it)."""

from __future__ import annotations

import pytest

from gateway.errors import CapacityExceeded
from gateway.limits import OrgLimits, limit_key
from routing import Identity
from tests.clock import FakeClock


def test_burst_then_refill():
    clock = FakeClock(100.0)
    limits = OrgLimits(rate=2.0, burst=3, clock=clock)
    for _ in range(3):
        limits.admit("acme")
    with pytest.raises(CapacityExceeded) as info:
        limits.admit("acme")
    assert info.value.status == 429 and info.value.scope == "org_rate"
    assert info.value.headers()["Retry-After"] == "1"  # half a second, rounded up to the header's 1 s
    clock.advance(0.5)
    limits.admit("acme")  # one token back after 1/rate seconds
    limits.admit("other-org")  # orgs do not share buckets


def test_unlimited_by_default():
    limits = OrgLimits()
    assert not limits.active
    for _ in range(10_000):
        limits.admit("acme")
        limits.open_stream("acme")


def test_stream_cap_counts_open_streams():
    limits = OrgLimits(max_streams=2)
    limits.open_stream("acme")
    limits.open_stream("acme")
    with pytest.raises(CapacityExceeded, match="max_streams_per_org 2"):
        limits.open_stream("acme")
    limits.close_stream("acme")
    limits.open_stream("acme")


def test_personal_accounts_are_limited_per_user():
    assert limit_key(Identity.parse(user_id="u1", session_id="s")) == "user:u1"
    assert limit_key(Identity.parse(org_id="o", user_id="u1", session_id="s")) == "o"


def test_forced_streams_count_past_the_cap():
    """A stream found out too late for a 429 still takes a slot, so the org's next stream is refused."""
    limits = OrgLimits(max_streams=1)
    limits.open_stream("acme")
    limits.open_stream("acme", force=True)
    assert limits.open_streams("acme") == 2
    limits.close_stream("acme")
    with pytest.raises(CapacityExceeded):
        limits.open_stream("acme")
    limits.close_stream("acme")
    assert limits.open_streams("acme") == 0
