"""The fault driver: each fault opens a window (what it breaks, which answers it may cause, for
whom), does its damage, waits for the system to show it has recovered, and closes the window.

Recovery is observed, never assumed: a restarted replica answers /readyz, Redis answers PING and
every replica's /readyz is 200 again, a killed sandbox answers its session with the right
identity through every live replica, the fake apiserver counts its watches back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field

from kubernetes_asyncio import client as kube_client

from tests.chaos.cluster import NAMESPACE, Cluster, Replica, provider_store_difference
from tests.chaos.driver import (DISCONNECTED, OK, REFUSED_CONNECTION, SECRET_MISSING, WRONG_OWNER, Load, Recorder,
                                Session, Window, http_class, now, session_of)
from tests.gateway_process import kill_sandbox

REPLICA_GONE = {REFUSED_CONNECTION, DISCONNECTED}
STORE_DOWN = {http_class(503, "store_unavailable")}
# A sandbox killed mid-answer is a 502 upstream_error; one gone before the connect, upstream_unreachable;
# the fake pods answer 503 pod_gone for a deleted object (a real pod IP would stop answering).
SANDBOX_DOWN = {http_class(502, "upstream_error"), http_class(502, "upstream_unreachable"),
                http_class(503, "pod_gone"),
                # A request whose heal re-creation raced the object's deletion: "Sandbox ... was deleted
                # while starting" (503, retryable); the next request heals it. Seen once in ~10 full runs.
                http_class(503, "provision_failed")}
IMPOSTOR_REFUSED = "impostor_refused"  # someone else's session ID claimed, and refused
SESSION_TAKEN = "session_taken"  # ... and granted, with a fresh sandbox (the victim's was gone)
HEAL_TIMEOUT = 60.0
CONVERGE_TIMEOUT = 60.0


@dataclass
class FaultLog:
    heal_seconds: dict[str, float] = field(default_factory=dict)
    bindings_lost: dict[str, int] = field(default_factory=dict)
    extra_sessions: list[Session] = field(default_factory=list)
    impostor_answers: dict[int, int] = field(default_factory=dict)  # HTTP status -> count
    sessions_taken: list[str] = field(default_factory=list)


class Faults:
    def __init__(self, cluster: Cluster, load: Load, recorder: Recorder) -> None:
        self.cluster = cluster
        self.load = load
        self.recorder = recorder
        self.log = FaultLog()
        self._heal_serial = 0

    # --- replicas -------------------------------------------------------------------------
    async def kill_replica(self, replica: Replica) -> None:
        window = self.recorder.open(f"replica {replica.index} SIGKILLed and restarted", REPLICA_GONE)
        await self.cluster.kill_replica(replica)
        await self.cluster.restart_replica(replica)
        self.recorder.close(window)

    # --- redis ----------------------------------------------------------------------------
    async def restart_redis(self, *, persistent: bool, outage: float) -> None:
        """Down for ``outage`` under load, then back. From its AOF nothing is lost. Back empty, every
        binding is gone: sessions re-bind to the sandboxes their identities derive to, and the orphan
        sweep deletes the sandboxes that the store does not know again within its grace (see
        test_orphan_grace_counts_from_a_store_reset: active sessions may lose theirs too). The
        window lasts until the provider's view and the store's agree again."""
        if persistent:
            name, expected = "Redis SIGKILLed, back from its AOF", STORE_DOWN
        else:
            name = "Redis SIGKILLed, back empty (no persistence)"
            expected = STORE_DOWN | SANDBOX_DOWN | {SECRET_MISSING}
        bound = await self.bound_sessions()  # a binding an earlier restart wiped is not this one's loss
        window = self.recorder.open(name, expected)
        await self.cluster.restart_redis(persistent=persistent, outage=outage)
        lost = bound - await self.bound_sessions()
        self.log.bindings_lost[name] = self.log.bindings_lost.get(name, 0) + len(lost)
        if not persistent:
            await self.impostors([s for s in self.load.sessions if s.sandbox_id.startswith("ses-")][:4])
        await self.cluster.wait_all_ready()
        if not persistent:
            await converge(self.cluster, f"after '{name}'")
        self.recorder.close(window)

    async def impostors(self, victims: list[Session]) -> None:
        """With the bindings gone, another identity claims each victim's session ID through every
        replica, racing the victim's own re-binding (a per-session sandbox's ID derives from the
        session ID alone, so both derive the same sandbox). The provider's owner records must refuse
        every claim: a 200 (the victim's secret read) is a sandbox given to the wrong owner. While a
        claim is being refused, the claimant holds the binding, so the victim may get 404 for a moment.

        A claim that reaches a sandbox without the victim's secret took the session ID over: the orphan
        sweep had already deleted the victim's sandbox and its owner record with it (the grace counts
        from the object's age, not the store's reset: test_orphan_grace_counts_from_a_store_reset).
        Not a breach (nothing of the victim's is left), but the victim is locked out of its session ID
        until the claimant lets go: the fault deletes the claimant's session, and the victim is served
        again, by a fresh sandbox."""
        window = self.recorder.open(f"other identities claim {len(victims)} sessions' IDs after the bindings were lost",
                                    {IMPOSTOR_REFUSED, SESSION_TAKEN, SECRET_MISSING, http_class(404, "not_found")},
                                    [v.session_id for v in victims])
        assert self.cluster.http is not None
        for victim in victims:
            impostor = dataclasses.replace(victim, user="mallory")
            answers = [await self.load.client.call(replica, impostor, "impostor", "GET",
                                                   f"/download/{victim.secret_name}", check=self._impostor_answer)
                       for replica in self.cluster.live()]
            if SESSION_TAKEN in answers:
                self.log.sessions_taken.append(victim.session_id)
                control = self.cluster.live()[0].process.control_url
                async with self.cluster.http.delete(f"{control}/v1/sessions/{victim.session_id}",
                                                    headers=impostor.headers) as response:
                    assert response.status == 200, await response.text()
        for victim in victims:
            await self.heal(victim, window, close=False)
        self.recorder.close(window)

    def _impostor_answer(self, status: int, body: bytes, answered_by: str | None) -> str:
        self.log.impostor_answers[status] = self.log.impostor_answers.get(status, 0) + 1
        if status == 200:
            return WRONG_OWNER
        return SESSION_TAKEN if answered_by is not None else IMPOSTOR_REFUSED

    async def bound_sessions(self) -> set[str]:
        """Sessions whose binding the store has (asked through a replica, owner-checked)."""
        sessions = [s for s in self.load.sessions + self.log.extra_sessions if s.kind in ("local", "kube")]
        bound = set()
        replica = self.cluster.live()[0]
        assert self.cluster.http is not None
        for session in sessions:
            for _ in range(100):
                async with self.cluster.http.get(f"{replica.process.control_url}/v1/sessions/{session.session_id}",
                                                 headers=session.headers) as response:
                    if response.status != 503:
                        if response.status == 200:
                            bound.add(session.session_id)
                        break
                await asyncio.sleep(0.1)  # the replica has not reconnected yet: no event to await
        return bound

    # --- sandboxes ------------------------------------------------------------------------
    async def kill_local_sandbox(self, session: Session) -> None:
        """Its process group SIGKILLed while every replica is up (its creator notices through a pidfd)."""
        window = self.recorder.open(f"sandbox of {session.session_id} killed, replicas up", SANDBOX_DOWN,
                                    [session.session_id])
        await self._kill_sandbox_process(session.sandbox_id)
        await self.heal(session, window)

    async def kill_local_sandbox_creator_dead(self, creator: Replica) -> None:
        """A fresh session bound through ``creator`` (so only it watches the process); the creator
        is SIGKILLed, then the sandbox; the survivors must find it gone and re-create it once."""
        self._heal_serial += 1
        session = session_of(self.cluster.policy_path, "iso", "heal-user", f"heal-{self._heal_serial}")
        self.log.extra_sessions.append(session)
        assert self.cluster.http is not None
        async with self.cluster.http.post(f"{creator.process.control_url}/v1/sessions",
                                          json={"org_id": session.org, "user_id": session.user,
                                                "session_id": session.session_id}) as response:
            assert response.status == 200, await response.text()
        window = self.recorder.open(f"replica {creator.index} and then the sandbox it created SIGKILLed",
                                    REPLICA_GONE | SANDBOX_DOWN)
        await self.cluster.kill_replica(creator)
        await self._kill_sandbox_process(session.sandbox_id)
        await self.heal(session, window, close=False)
        await self.cluster.restart_replica(creator)
        self.recorder.close(window)

    async def _kill_sandbox_process(self, sandbox_id: str) -> None:
        """SIGKILL the sandbox's process group and wait until every process of it has exited (not only
        its leader: the runtime may still be dying with its socket open, and accept a request it drops)."""
        pid = json.loads((self.cluster.registry / sandbox_id / "state.json").read_text())["pid"]
        await asyncio.to_thread(kill_sandbox, sandbox_id, pid, HEAL_TIMEOUT)

    async def delete_kube_sandbox(self, session: Session, *, drop_watches: bool = False) -> None:
        """The Sandbox object deleted behind the gateway's back (after cutting every watch, with
        ``drop_watches``: the replicas learn of it on their reconnected watch, or on probing)."""
        name = (f"watches dropped, then the Sandbox of {session.session_id} deleted" if drop_watches
                else f"Sandbox of {session.session_id} deleted behind the gateway")
        window = self.recorder.open(name, SANDBOX_DOWN, [session.session_id])
        server = self.cluster.kube.server
        if drop_watches:
            server.drop_watches(abrupt=True)
        api = await self.cluster.kube.api_client()
        try:
            await kube_client.CustomObjectsApi(api).delete_namespaced_custom_object(
                "agents.x-k8s.io", "v1beta1", NAMESPACE, "sandboxes", session.sandbox_id)
        finally:
            await api.close()
        await self.watches_back()
        await self.heal(session, window)

    async def drop_watches(self) -> None:
        window = self.recorder.open("every fake-apiserver watch dropped", ())
        self.cluster.kube.server.drop_watches(abrupt=True)  # removed from the count at once
        await self.watches_back()
        self.recorder.close(window)

    async def watches_back(self) -> None:
        """Until every live replica has its watch on the pool's Sandboxes open again (one each; a
        creation's own readiness watch may come and go beside it)."""
        await self.cluster.kube.server.wait_for_watchers(len(self.cluster.live()), timeout=HEAL_TIMEOUT)

    async def heal(self, session: Session, window: Window, *, close: bool = True) -> None:
        """Until the session is served by its own sandbox through every live replica (the heal is
        the system's to do; this only looks, through the same client as the load)."""
        started = now()
        for replica in self.cluster.live():
            deadline = started + HEAL_TIMEOUT
            while (klass := await self.load.exercise(session, replica=replica)) != OK:
                assert now() < deadline, (f"{session.session_id} not served by its sandbox through replica "
                                          f"{replica.index} within {HEAL_TIMEOUT:g}s of '{window.name}': {klass}")
                await asyncio.sleep(0.05)  # the next attempt: the heal itself has no event to await
        self.log.heal_seconds[window.name] = now() - started
        if close:
            self.recorder.close(window)



async def converge(cluster: Cluster, when: str) -> None:
    """Until the provider's view of the sandboxes and the store's agree (the orphan sweep runs on its
    interval, creations finish on theirs: there is no one event to await)."""
    deadline = now() + CONVERGE_TIMEOUT
    while difference := await provider_store_difference(cluster):
        assert now() < deadline, f"provider and store still disagree {CONVERGE_TIMEOUT:g}s {when}: {difference}"
        await asyncio.sleep(0.2)
