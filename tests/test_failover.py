"""Three real gateway replicas on Redis behind Sentinel: the primary is killed under load.

What an operator is promised (docs/deployment.md, "Failover"): sessions already routed keep being
served from the route cache; new sessions get 503 with Retry-After only while there is no primary
and are served again within 2 s of the promotion; with ``redis_replica_acks: 1`` no sandbox is
created twice, none serves the wrong session, and no binding that was answered is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from routing import per_session_sandbox_id, shared_sandbox_id
from tests.gateway_process import is_runtime_of
from tests.redis_server import SentinelGroup, sentinel_group  # noqa: F401  (fixture)
from tests.test_redis_sentinel import promoted
from tests.test_replicas import replicas_factory, who, whoami  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


@dataclass
class Answer:
    sent: float
    status: int
    sandbox: str | None
    session: str
    retry_after: str | None
    done: float = 0.0


def expected_sandbox(session: str) -> str:
    """iso-* sessions have their own sandbox; team-<user>-* sessions share their user's."""
    if session.startswith("team-"):
        return shared_sandbox_id("team", session.split("-")[1], None)
    return per_session_sandbox_id(session)


def headers(session: str) -> dict[str, str]:
    if session.startswith("team-"):
        return who("team", session, user=session.split("-")[1])
    return who("iso", session, user=session)


async def ask(http: aiohttp.ClientSession, url: str, session: str) -> Answer:
    sent = time.monotonic()
    try:
        async with http.get(f"{url}/", headers=headers(session),
                            timeout=aiohttp.ClientTimeout(total=15)) as response:
            body = await response.json(content_type=None)
            sandbox = body.get("sandbox_id") or body.get("error", {}).get("message")
            return Answer(sent, response.status, sandbox, session, response.headers.get("Retry-After"),
                          time.monotonic())
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Answer(sent, 0, repr(exc), session, None, time.monotonic())


def runtime_sessions(sandbox_id: str) -> set[int]:
    """The process sessions the sandbox's processes run in: one per start of that sandbox."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and is_runtime_of(int(entry), sandbox_id):
            try:
                found.add(os.getsid(int(entry)))
            except ProcessLookupError:
                pass
    return found


@pytest.fixture
def shared_data(tmp_path: Path):
    """One host: the replicas share the local sandbox registry (its sandboxes are killed after)."""
    shared = tmp_path / "shared-data"
    yield shared
    for state in shared.glob("sandboxes/*/state.json"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(json.loads(state.read_text())["pid"], signal.SIGKILL)


async def test_primary_killed_under_load_through_three_replicas(sentinel_group: SentinelGroup, replicas_factory,
                                                                 shared_data: Path):
    # (sentinel_group first: it is torn down after the replicas, which release what they hold in Redis)
    group = sentinel_group
    shared = shared_data
    replicas = await replicas_factory(group.url(), 3, "--data-dir", str(shared), env={
        "SANDBOX_GATEWAY_ROUTE_CACHE_TTL": "60", "SANDBOX_GATEWAY_REDIS_REPLICA_ACKS": "1",
        # the first write after the promotion waits this long for the lost replica (the default)
        "SANDBOX_GATEWAY_REDIS_REPLICA_ACK_TIMEOUT": "1",
        "SANDBOX_GATEWAY_CREATION_LEASE": "5"})
    existing = [f"iso-old-{i}" for i in range(4)] + [f"team-u{i}-old" for i in range(2)]
    stop = asyncio.Event()
    old: list[Answer] = []
    new: list[Answer] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for session in existing:  # bound, and in every replica's route cache
            for replica in replicas:
                status, sandbox = await whoami(http, replica, headers(session))
                assert (status, sandbox) == (200, expected_sandbox(session))

        async def old_load(worker: int) -> None:
            n = worker
            while not stop.is_set():
                old.append(await ask(http, replicas[n % 3].data_url, existing[n % len(existing)]))
                n += 1
                await asyncio.sleep(0.01)

        async def new_load(worker: int) -> None:
            n = 0
            while not stop.is_set():
                # new sandboxes (iso), and new sessions bound to a sandbox that exists (team)
                session = f"iso-new{worker}-{n}" if worker < 2 else f"team-u{worker % 2}-new{worker}-{n}"
                while not stop.is_set():  # a client retrying the same session, as Retry-After says
                    answer = await ask(http, replicas[(worker + n) % 3].data_url, session)
                    new.append(answer)
                    if answer.status == 200:
                        break
                    await asyncio.sleep(0.1)
                n += 1

        load = [asyncio.create_task(old_load(i)) for i in range(3)] + [asyncio.create_task(new_load(i)) for i in range(4)]
        try:
            await asyncio.sleep(1.0)  # load before the kill
            killed = time.monotonic()
            group.primary.stop(kill=True)
            await promoted(group)
            promotion = time.monotonic()
            await asyncio.sleep(4.0)  # load after the promotion
        finally:
            stop.set()
            await asyncio.gather(*load)

        served = {a.session: a.sandbox for a in new if a.status == 200}
        lost = []
        for session, sandbox in served.items():
            async with http.get(f"{replicas[0].control_url}/v1/sessions/{session}") as response:
                if response.status != 200 or (await response.json())["sandbox_id"] != sandbox:
                    lost.append(session)

    refused_old = [a for a in old if a.status != 200]
    assert not refused_old, refused_old[:5]  # existing sessions: served throughout, from the cache
    assert len(old) > 100
    wrong = [a for a in old + new if a.status == 200 and a.sandbox != expected_sandbox(a.session)]
    assert not wrong, wrong[:5]  # 0 wrong owner: every answer from the session's own sandbox
    refused = [a for a in new if a.status != 200]
    # 503 with a Retry-After of a second or two: "its primary cannot be reached" until Sentinel sees it
    # down, then "no primary" (an unreachable plain Redis says 5)
    assert all(a.status == 503 and a.retry_after in ("1", "2") for a in refused), refused[:5]
    assert all(a.done >= killed and a.sent <= promotion + 2.0 for a in refused), (
        [(round(a.sent - promotion, 2), round(a.done - promotion, 2), a.sandbox) for a in refused],
        round(killed - promotion, 2))
    after = [a for a in new if a.sent >= promotion + 2.0]
    assert after and all(a.status == 200 for a in after)  # new sessions served again within 2 s
    assert any(a.sent < killed for a in new if a.status == 200)
    assert lost == []  # bindings lost: 0 (each was on the replica before it was answered)
    for sandbox_id in {expected_sandbox(s) for s in [*existing, *served]}:
        state = json.loads((shared / "sandboxes" / sandbox_id / "state.json").read_text())
        assert runtime_sessions(sandbox_id) == {state["pid"]}, sandbox_id  # created once, still the same
    first = min((a.done - promotion for a in new if a.status == 200 and a.sent > killed), default=None)
    print(f"\nfailover: {len(old)} requests on existing sessions, all 200; {len(served)} new sessions "
          f"({sum(1 for s in served if s.startswith('iso'))} with a new sandbox), first answered "
          f"{first:+.2f}s after the promotion; "
          f"{len(refused)} refusals (503) between {min((a.sent - promotion for a in refused), default=0):+.2f}s and "
          f"{max((a.sent - promotion for a in refused), default=0):+.2f}s of the promotion "
          f"({promotion - killed:.2f}s after the kill); bindings lost 0")
