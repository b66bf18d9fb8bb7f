"""Time on a client connection to the gRPC front: handshake and SETTINGS-ACK deadlines, idle timeout,
keepalive enforcement and maximum age (what grpc-go's server enforces, ``keepalive.ServerParameters``
and ``EnforcementPolicy``).

Why: without them a client that connects and sends nothing, or stays connected with no call, holds a
descriptor for ever, and a few thousand of them fill the process's descriptor table (the data plane,
the control API and the sandboxes' own connections then fail). Each connection has one timer handle at
its nearest deadline; state changes (a call starts or ends) only record a time, and a timer that
fires early re-arms itself for what is due then, so a busy connection costs no timer work per call.
The handshake and SETTINGS-ACK deadlines of each connection fall at a random point of the quarter after the
timeout (``DEADLINE_SPREAD``): a flood of connections admitted together would otherwise time out in the same
loop iteration and reconnect together, thousands of closes and accepts in one stall every timeout.

What a client gets past each bound:

- no preface and first SETTINGS within ``handshake_timeout``: closed; without a word when the preface is
  missing (our SETTINGS, sent once it arrives, were never sent: connection.py ``_greet``), else GOAWAY
  PROTOCOL_ERROR;
- no ACK of our SETTINGS within ``settings_ack_timeout`` of sending them: GOAWAY SETTINGS_TIMEOUT (RFC 9113
  6.5.3);
- no call for ``idle_timeout``: GOAWAY NO_ERROR, then the close (a client reconnects when it needs to);
- PINGs while no call runs, more often than ``keepalive_min_time`` (or at all, unless
  ``keepalive_permit_without_calls``): each is a strike; past ``MAX_PING_STRIKES`` GOAWAY
  ENHANCE_YOUR_CALM "too_many_pings", which grpc clients read as "double your keepalive time".
  PINGs while calls run are not limited here (a flood that is not read is cut by the write backlog);
- ``max_connection_age`` (off by default): GOAWAY NO_ERROR (new calls go to a new connection, which a
  load balancer may place elsewhere); the calls running then have ``max_connection_age_grace`` to end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.grpcfront import frames as f

if TYPE_CHECKING:
    from gateway.grpcfront.connection import Connection

MAX_PING_STRIKES = 2   # grpc-go's maxPingStrikes: the third too-early PING ends the connection
_NO_CALL_PING_INTERVAL = 7200.0  # without calls and not permitted: grpc-go's two hours between PINGs
SETTINGS_TIMEOUT = 0x4  # RFC 9113 7
# The handshake and SETTINGS-ACK deadlines: the timeout plus up to a quarter of it, at random. An idle
# connection closed at its deadline and at once reconnected costs the front about 190 us; spread over a tenth
# (1 s at the default 10 s), a wave of 4,000 took three quarters of the loop for that second, and the control
# API's /healthz p99 under it was 2.7-3.3x its baseline (issue 28). Over a quarter it takes about 30%, as the
# data plane's paced closes (gateway/proxy/_plane.py SLICE_EVERY) take of theirs.
DEADLINE_SPREAD = 0.25
# uvloop's timers and loop.time() count whole milliseconds (libuv's cached uv_now), so a timer for a deadline
# between two of them fires when the clock still reads up to 1 ms short of it. Compared exactly, _fire found
# the deadline not yet due and armed the timer again, which fired again the next loop turn, and so on until
# the clock caught up: 26 turns per deadline on average, which made an idle connection cost the front 3.6
# times what it costs the data plane (issue 28). A deadline this close is due.
CLOCK_SLACK = 0.001


@dataclasses.dataclass(frozen=True, slots=True)
class Timing:
    """The front's connection timing (``Settings.grpc_*``; see gateway/settings.py for each default)."""

    handshake_timeout: float = 10.0
    settings_ack_timeout: float = 10.0
    idle_timeout: float | None = 300.0
    keepalive_min_time: float = 300.0
    keepalive_permit_without_calls: bool = False
    max_connection_age: float | None = None
    max_connection_age_grace: float = 30.0

    @classmethod
    def from_settings(cls, settings: Any) -> Timing:
        return cls(**{field.name: getattr(settings, f"grpc_{field.name}") for field in dataclasses.fields(cls)})


class Keeper:
    """The deadlines of one server-side connection; ``on_close(reason)`` counts why the front closed it."""

    __slots__ = ("conn", "timing", "on_close", "_loop", "_handle", "_at", "_start", "_handshaken", "_sent", "_acked",
                 "_idle_since", "_last_ping", "_strikes", "_aging", "_spread")

    def __init__(self, conn: Connection, timing: Timing, on_close: Callable[[str], None]) -> None:
        self.conn = conn
        self.timing = timing
        self.on_close = on_close
        self._loop = conn.loop  # asyncio.get_running_loop() costs a getpid() on 3.11, per connection
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0
        now = self._loop.time()
        self._start = now
        self._spread = 1.0 + DEADLINE_SPREAD * random.random()  # of the handshake and SETTINGS-ACK timeouts
        self._handshaken = False
        self._sent: float | None = None  # when our SETTINGS went out (after the client's preface): the ACK's time
        self._acked = False
        self._idle_since: float | None = now
        self._last_ping: float | None = None
        self._strikes = 0
        self._aging = False  # the age GOAWAY was sent; the grace runs
        self._arm()

    # -- what the connection tells ------------------------------------------------------
    def handshaken(self) -> None:
        """The preface and the first SETTINGS arrived."""
        self._handshaken = True

    def settings_sent(self) -> None:
        """Our SETTINGS went out: their ACK is due within settings_ack_timeout from now."""
        self._sent = self._loop.time()
        self._arm()

    def settings_acked(self) -> None:
        self._acked = True

    def call_started(self) -> None:
        self._idle_since = None
        self._strikes = 0  # a client making calls may keep its connection alive (grpc-go resets on activity)

    def calls_ended(self) -> None:
        """No call runs on the connection any more."""
        now = self._idle_since = self._loop.time()
        if self._aging:  # past its age, the connection waited only for its calls
            self._end(None, f.NO_ERROR, "max connection age")
            return
        idle = self.timing.idle_timeout
        if self._handle is not None and (idle is None or now + idle >= self._at):
            return  # what _arm would find (every other deadline was armed as it was set): the armed one comes first
        self._arm()

    def ping(self) -> bool:
        """A PING arrived; False when it is one too many (the connection is then ending)."""
        timing = self.timing
        now = self._loop.time()
        last, self._last_ping = self._last_ping, now
        if self.conn.active or last is None:
            return True
        interval = (timing.keepalive_min_time if timing.keepalive_permit_without_calls
                    else max(timing.keepalive_min_time, _NO_CALL_PING_INTERVAL))
        if now - last >= interval:
            return True
        self._strikes += 1
        if self._strikes <= MAX_PING_STRIKES:
            return True
        self._end("too_many_pings", f.ENHANCE_YOUR_CALM, "too_many_pings")
        return False

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    # -- deadlines ----------------------------------------------------------------------
    def _due(self) -> float | None:
        timing = self.timing
        due: list[float] = []
        if not self._handshaken:
            due.append(self._start + timing.handshake_timeout * self._spread)
        if not self._acked and self._sent is not None:
            due.append(self._sent + timing.settings_ack_timeout * self._spread)
        if self._idle_since is not None and timing.idle_timeout is not None:
            due.append(self._idle_since + timing.idle_timeout)
        if timing.max_connection_age is not None:
            age = self._start + timing.max_connection_age
            due.append(age + timing.max_connection_age_grace if self._aging else age)
        return min(due) if due else None

    def _arm(self) -> None:
        due = self._due()
        if due is None:
            self.stop()
        elif self._handle is None or due < self._at:
            self.stop()
            self._at = due
            self._handle = self._loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self._handle = None
        conn = self.conn
        if conn.closed:
            return
        timing, now = self.timing, self._loop.time() + CLOCK_SLACK
        if not self._handshaken and now >= self._start + timing.handshake_timeout * self._spread:
            self._end("handshake_timeout", f.PROTOCOL_ERROR,
                      f"no HTTP/2 preface and SETTINGS within {timing.handshake_timeout:g} s")
            return
        if not self._acked and self._sent is not None and now >= self._sent + timing.settings_ack_timeout * self._spread:
            self._end("settings_timeout", SETTINGS_TIMEOUT,
                      f"our SETTINGS were not acknowledged within {timing.settings_ack_timeout:g} s")
            return
        if timing.max_connection_age is not None:
            age = self._start + timing.max_connection_age
            if self._aging and now >= age + timing.max_connection_age_grace:
                self._end(None, f.NO_ERROR, "max connection age")
                return
            if not self._aging and now >= age:
                self._aging = True
                self.on_close("max_age")
                conn.shut_down("max connection age")
        if self._idle_since is not None:
            if self._aging:
                self._end(None, f.NO_ERROR, "max connection age")
                return
            if timing.idle_timeout is not None and now >= self._idle_since + timing.idle_timeout:
                self._end("idle", f.NO_ERROR, f"idle for {timing.idle_timeout:g} s")
                return
        self._arm()

    def _end(self, reason: str | None, code: int, message: str) -> None:
        """Close the connection (GOAWAY ``code``); ``reason`` is counted (None: counted already)."""
        self.stop()
        if reason is not None:
            self.on_close(reason)
        self.conn.close(code, message)


class NoKeeper(Keeper):
    """The null object: a connection that keeps no time (ours to a sandbox, whose end we trust). A ``Keeper``, so
    that the compiled build types ``FrameReader.keeper`` and a call's start and end (``call_started``,
    ``calls_ended``) are C calls, not Python method calls; it overrides every method a connection calls."""

    __slots__ = ()

    def __init__(self) -> None:  # no connection, no deadline: nothing of Keeper's is set or armed
        pass

    def handshaken(self) -> None:
        pass

    def settings_sent(self) -> None:
        pass

    def settings_acked(self) -> None:
        pass

    def call_started(self) -> None:
        pass

    def calls_ended(self) -> None:
        pass

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        pass


NO_KEEPER = NoKeeper()
