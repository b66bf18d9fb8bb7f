"""Steady load on the replicas: many sessions across several orgs, identity headers, every answer
classified and timed.

Each session writes a secret naming its owner into its sandbox (``owner.txt``, one per sandbox:
the sandbox's owner; ``secret-<session>.txt``: the session itself) and checks that every read
returns its own, and that every answer came from the sandbox its identity derives to (the
runtime stamps ``X-Runtime-Sandbox-Id``). Anything else is a sandbox given to the wrong owner.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from routing import Identity, parse_policy, place
from tests.chaos.cluster import KUBE, LOCAL_ISOLATED, LOCAL_SHARED, REFUSED, STALL, Cluster, Replica

OK = "ok"
REFUSED_CONNECTION = "refused"      # the replica is not listening (killed)
DISCONNECTED = "disconnected"       # the replica went away mid-request
CLIENT_TIMEOUT = "client_timeout"   # no answer within the driver's own bound
WRONG_OWNER = "wrong_owner"         # an answer from, or a file of, someone else's sandbox
SECRET_MISSING = "secret_missing"   # the right sandbox, but the session's file is gone

CLIENT_TIMEOUT_SECONDS = 30.0


def http_class(status: int, code: str) -> str:
    return f"http_{status}:{code}"


@dataclass(frozen=True)
class Session:
    org: str
    user: str
    session_id: str
    sandbox_id: str
    pool: str

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Org-Id": self.org, "X-User-Id": self.user, "X-Session-Id": self.session_id}

    @property
    def owner(self) -> str:
        """What ``owner.txt`` holds: the sandbox's owner (a shared sandbox is its user's in its org)."""
        per_session = self.sandbox_id.startswith("ses-")
        return f"{self.org}/{self.user}/{self.session_id}" if per_session else f"{self.org}/{self.user}"

    @property
    def secret_name(self) -> str:
        return f"secret-{self.session_id}.txt"

    @property
    def kind(self) -> str:
        return {"small": "local", "shared": "local", "kube": "kube"}.get(self.pool, self.pool)


@dataclass
class Sample:
    t0: float
    t1: float
    session: str
    op: str
    klass: str
    replica: int

    @property
    def latency(self) -> float:
        return self.t1 - self.t0


@dataclass
class Window:
    """A fault, from its start until the system is seen to have recovered: during it, answers of
    ``expected`` classes are the fault's, not the gateway's (for ``sessions`` only, when given)."""

    name: str
    start: float
    end: float = float("inf")
    expected: frozenset[str] = frozenset()
    sessions: frozenset[str] | None = None
    transient: bool = True  # False: a standing condition (a stalling pool), not a fault of the run
    notes: dict[str, object] = field(default_factory=dict)

    def covers(self, sample: Sample, grace: float) -> bool:
        return (sample.klass in self.expected and sample.t1 >= self.start and sample.t0 <= self.end + grace
                and (self.sessions is None or sample.session in self.sessions))


@dataclass
class Recorder:
    samples: list[Sample] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    load_started: float = 0.0  # samples before it are the warm-up (sandboxes being created): not in the p99s

    def open(self, name: str, expected: Iterable[str], sessions: Iterable[str] | None = None,
             *, transient: bool = True) -> Window:
        window = Window(name, now(), expected=frozenset(expected),
                        sessions=None if sessions is None else frozenset(sessions), transient=transient)
        self.windows.append(window)
        return window

    @staticmethod
    def close(window: Window) -> None:
        window.end = now()


def now() -> float:
    return asyncio.get_running_loop().time()


def make_sessions(policy_path: Path, *, isolated: int, shared_users: int, per_user: int, kube: int,
                  stalled: int, refused: int, tag: str = "") -> list[Session]:
    policy = parse_policy(policy_path.read_text(), str(policy_path))
    specs: list[tuple[str, str, str]] = []
    specs += [(LOCAL_ISOLATED, f"iu{i}", f"iso{tag}-{i}") for i in range(isolated)]
    specs += [(LOCAL_SHARED, f"tu{u}", f"team{tag}-{u}-{j}") for u in range(shared_users) for j in range(per_user)]
    specs += [(KUBE, f"ku{i}", f"kube{tag}-{i}") for i in range(kube)]
    specs += [(STALL, "su", f"stall{tag}-{i}") for i in range(stalled)]
    specs += [(REFUSED, "ru", f"refused{tag}-{i}") for i in range(refused)]
    return [session_of(policy_path, org, user, sid, policy) for org, user, sid in specs]


def session_of(policy_path: Path, org: str, user: str, session_id: str, policy: object = None) -> Session:
    policy = policy or parse_policy(policy_path.read_text(), str(policy_path))
    placement = place(Identity(user_id=user, session_id=session_id, org_id=org), policy)  # type: ignore[arg-type]
    return Session(org, user, session_id, placement.sandbox_id, placement.pool)


class Client:
    """One request, timed and classified into the recorder; never raises for the server's behaviour."""

    def __init__(self, http: aiohttp.ClientSession, recorder: Recorder) -> None:
        self.http = http
        self.recorder = recorder

    async def call(self, replica: Replica, session: Session, op: str, method: str, path: str,
                   check: Callable[[int, bytes, str | None], str] | None = None, **kwargs: object) -> str:
        t0 = now()
        klass = await self._send(replica, session, method, path, check, **kwargs)
        self.recorder.samples.append(Sample(t0, now(), session.session_id, op, klass, replica.index))
        return klass

    async def _send(self, replica: Replica, session: Session, method: str, path: str,
                    check: Callable[[int, bytes, str | None], str] | None, **kwargs: object) -> str:
        try:
            async with asyncio.timeout(CLIENT_TIMEOUT_SECONDS):
                async with self.http.request(method, replica.process.data_url + path, headers=session.headers,
                                             **kwargs) as response:  # type: ignore[arg-type]
                    body = await response.read()
                    answered_by = response.headers.get("X-Runtime-Sandbox-Id")
                    if answered_by is not None and answered_by != session.sandbox_id:
                        return WRONG_OWNER
                    if check is not None:
                        return check(response.status, body, answered_by)
                    return OK if response.status == 200 else _error_class(response.status, body)
        except TimeoutError:
            return CLIENT_TIMEOUT
        except aiohttp.ClientConnectorError:
            return REFUSED_CONNECTION
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError):
            return DISCONNECTED


def _error_class(status: int, body: bytes) -> str:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = "?"
    return http_class(status, str(code))


class Load:
    """Workers that cycle through their sessions on whichever replicas are up, until stopped."""

    def __init__(self, cluster: Cluster, recorder: Recorder, sessions: list[Session], *, workers: int,
                 slow_command: str = "sleep 0.5", slow_every: int = 10) -> None:
        self.cluster = cluster
        self.client = Client(cluster.http, recorder)  # type: ignore[arg-type]
        self.sessions = sessions
        self.workers = workers
        self.slow_command = slow_command
        self.slow_every = slow_every
        self.written: set[str] = set()  # sessions whose secret is in place
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._pick = itertools.count()

    def replica(self) -> Replica:
        live = self.cluster.live()
        return live[next(self._pick) % len(live)]

    def start(self) -> None:
        served = [s for s in self.sessions if s.kind in ("local", "kube")]
        standing = [s for s in self.sessions if s.kind not in ("local", "kube")]
        for index in range(self.workers):
            mine = served[index::self.workers]
            if mine:
                self._tasks.append(asyncio.create_task(self._work(mine)))
        if standing:  # the stalling pool holds each request for the read timeout: its own worker
            self._tasks.append(asyncio.create_task(self._work(standing)))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _work(self, sessions: list[Session]) -> None:
        for turn in itertools.count():
            for session in sessions:
                if self._stop.is_set():
                    return
                await self.exercise(session, slow=turn % self.slow_every == self.slow_every - 1)

    async def exercise(self, session: Session, *, slow: bool = False, replica: Replica | None = None) -> str:
        """One round for a session: who answers, then its secrets; the first failure ends the round."""
        at = replica or self.replica()
        klass = await self.client.call(at, session, "whoami", "GET", "/", check=lambda s, b, by: _whoami(session, s, b))
        if klass != OK or session.kind not in ("local", "kube"):
            return klass
        if session.session_id not in self.written:
            klass = await self.write_secrets(session, at)
            if klass != OK:
                return klass
        klass = await self.read_secrets(session, at)
        if klass == SECRET_MISSING:
            self.written.discard(session.session_id)
        if klass == OK and slow and session.kind == "local":
            klass = await self.client.call(at, session, "slow", "POST", "/execute",
                                           json={"command": self.slow_command})
        return klass

    async def write_secrets(self, session: Session, at: Replica) -> str:
        for name, content in (("owner.txt", session.owner), (session.secret_name, _secret(session))):
            form = aiohttp.FormData()
            form.add_field("file", content.encode(), filename=name)
            klass = await self.client.call(at, session, "write", "POST", "/upload", data=form)
            if klass != OK:
                return klass
        self.written.add(session.session_id)
        return OK

    async def read_secrets(self, session: Session, at: Replica) -> str:
        for name, content in (("owner.txt", session.owner), (session.secret_name, _secret(session))):
            klass = await self.client.call(at, session, "read", "GET", f"/download/{name}",
                                           check=lambda s, b, by, want=content: _secret_check(want, s, b, by))
            if klass != OK:
                return klass
        return OK


def _secret(session: Session) -> str:
    return f"{session.org}/{session.user}/{session.session_id}"


def _whoami(session: Session, status: int, body: bytes) -> str:
    if status != 200:
        return _error_class(status, body)
    try:
        answered = json.loads(body).get("sandbox_id")
    except ValueError:
        return http_class(status, "not_json")
    return OK if answered == session.sandbox_id else WRONG_OWNER


def _secret_check(want: str, status: int, body: bytes, answered_by: str | None) -> str:
    if status == 404 and answered_by is not None:
        return SECRET_MISSING  # the runtime itself says the file is not there
    if status != 200:
        return _error_class(status, body)
    return OK if body.decode(errors="replace") == want else WRONG_OWNER
