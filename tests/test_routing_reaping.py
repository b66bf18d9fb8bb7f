"""The reaper's verdicts: a sandbox's state, last activity and pool, and the time, in; what to do out.

``gateway.lifecycle`` acts on these (and checks open streams and a fresh read); the decisions
themselves are pure, so they are tested here as a table, at the edges of every cutoff.
"""

from __future__ import annotations

import pytest

from routing import PoolSpec
from routing.reaping import KEEP, Act, Verdict, orphaned, reap_verdict

NOW = 1_000_000.0
GRACE = 20.0  # RouterTuning.activity_grace
DELETES = PoolSpec(idle_timeout=600, retention=3600)
SUSPENDS = PoolSpec(idle_timeout=600, on_idle="suspend", retention=3600)
SHORT = PoolSpec(idle_timeout=5, on_idle="suspend", retention=3600)  # shorter than the activity grace


@pytest.mark.parametrize(("state", "idle_for", "pool", "can_suspend", "verdict"), [
    pytest.param("ready", 599, DELETES, True, KEEP, id="ready, within its idle_timeout"),
    pytest.param("ready", 600, DELETES, True, KEEP, id="ready, active exactly at the cutoff: kept"),
    pytest.param("ready", 601, DELETES, True, Verdict(Act.DELETE, "idle", NOW - 600), id="ready and idle: deleted"),
    pytest.param("ready", 601, SUSPENDS, True, Verdict(Act.SUSPEND, "idle", NOW - 600),
                 id="on_idle suspend: suspended"),
    pytest.param("ready", 601, SUSPENDS, False, Verdict(Act.DELETE, "idle", NOW - 600),
                 id="on_idle suspend, but its provider cannot: deleted"),
    pytest.param("ready", 10, SHORT, True, KEEP, id="an idle_timeout below the activity grace waits for the grace"),
    pytest.param("ready", 21, SHORT, True, Verdict(Act.SUSPEND, "idle", NOW - GRACE),
                 id="past the activity grace: due"),
    pytest.param("suspended", 3599, SUSPENDS, True, KEEP, id="suspended, within its retention"),
    pytest.param("suspended", 3601, SUSPENDS, True, Verdict(Act.DELETE, "retention", NOW - 3600),
                 id="suspended past its retention: deleted"),
    pytest.param("suspended", 10_000, SUSPENDS, False, Verdict(Act.DELETE, "retention", NOW - 3600),
                 id="retention does not ask the provider"),
    pytest.param("ready", 10**6, None, True, KEEP, id="a pool no longer in the policy: never reaped on a guess"),
    pytest.param("suspended", 10**6, None, True, KEEP, id="nor suspended ones of it"),
    pytest.param("creating", 10**6, DELETES, True, KEEP, id="creating: never"),
    pytest.param("suspending", 10**6, SUSPENDS, True, KEEP, id="suspending: never"),
    pytest.param("resuming", 10**6, SUSPENDS, True, KEEP, id="resuming: never"),
])
def test_reap_verdict(state: str, idle_for: float, pool: PoolSpec | None, can_suspend: bool,
                      verdict: Verdict) -> None:
    assert reap_verdict(state, NOW - idle_for, pool, NOW, activity_grace=GRACE, can_suspend=can_suspend) == verdict


@pytest.mark.parametrize(("known", "age", "swept"), [
    pytest.param(False, 601, True, id="unknown and older than the grace: an orphan"),
    pytest.param(False, 600, False, id="exactly the grace old: its creation may be in flight"),
    pytest.param(False, 1, False, id="young: a replica may not have written its record yet"),
    pytest.param(True, 10**6, False, id="known to the store: never"),
])
def test_orphaned(known: bool, age: float, swept: bool) -> None:
    assert orphaned(known, NOW - age, NOW, 600) is swept
