"""A loop-turn probe for a gateway process (issue 28); inactive unless ``LOOP_PROBE`` names an output prefix.

    LOOP_PROBE=/tmp/lp/probe PYTHONPATH=$PWD/benchmarks/loop_probe \\
        .venv/bin/python benchmarks/neighbours.py --only slowloris --no-local --calls-log /tmp/lp/calls
    .venv/bin/python benchmarks/loop_probe/report.py /tmp/lp

PYTHONPATH must be absolute (the gateway runs in a directory of its own). Loaded through ``sitecustomize`` by
every Python process that inherits the environment (the gateway ``serve``
started by neighbours.py among them); it hooks the event loop a process makes through its policy (``serve``
sets uvloop's). A 1 ms timer measures the loop thread's CPU time (``time.thread_time``) between its firings:
an interval of more than 0.5 ms (or one that came more than 1 ms late with the loop thread not running:
``lost``) is written down with the connections accepted meanwhile (the listeners'
protocol factories are counted), the CPU of the cyclic GC's collections by generation (``gc.callbacks``)
and of the data plane's clock (``DataPlane._tick``, ``_check_slice``, ``wake_slow_heads``, ``close_slices``).
CPU time is the process's own work, which load does not add to (on a VM, stolen time may). Each process
writes ``<prefix>.<pid>`` every 2 s; the gateway's is the largest. Not for production: it costs a timer
per millisecond.
"""

from __future__ import annotations

import os

if os.environ.get("LOOP_PROBE"):
    import asyncio
    import gc
    import threading
    import time
    from typing import Any

    PERIOD = 0.001  # uvloop's timers count whole milliseconds
    _records: list[tuple[float, float, int, str]] = []  # wall clock, CPU ms, accepts, "name=ms ..."
    _accepts = [0]
    _spent: dict[str, float] = {}  # CPU seconds, by what
    _gc_began = [0.0]
    _hooked: list[int] = []

    def _gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _gc_began[0] = time.thread_time()
        else:
            name = f"gc{info['generation']}"
            _spent[name] = _spent.get(name, 0.0) + time.thread_time() - _gc_began[0]

    gc.callbacks.append(_gc)

    def _timed(cls: type, name: str) -> None:
        method = getattr(cls, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                _spent[name] = _spent.get(name, 0.0) + time.thread_time() - began

        setattr(cls, name, timed)

    def _hook_gateway() -> None:
        try:
            from gateway.proxy._plane import DataPlane
        except ImportError:
            return
        for name in ("_tick", "_check_slice", "wake_slow_heads", "close_slices"):
            if hasattr(DataPlane, name):
                _timed(DataPlane, name)

    def _sample(loop: asyncio.AbstractEventLoop) -> None:
        last = [time.thread_time(), 0, dict(_spent), time.perf_counter()]

        def tick() -> None:
            cpu, wall = time.thread_time(), time.perf_counter()
            used = cpu - last[0]
            # the wall-clock time the loop thread was due to run and did not (preempted, stolen by the
            # hypervisor, or waiting for the GIL): not the gateway's work, but its clients wait for it too
            lost = wall - last[3] - used - 2 * PERIOD
            last[3] = wall
            if used > 0.0005 or lost > 0.001:
                parts = " ".join(f"{k}={(v - last[2].get(k, 0.0)) * 1e3:.2f}" for k, v in _spent.items()
                                 if v - last[2].get(k, 0.0) > 1e-4)
                parts += f" lost={lost * 1e3:.2f}" if lost > 0.001 else ""
                _records.append((time.time(), used * 1e3, _accepts[0] - last[1], parts))
            last[0], last[1], last[2] = cpu, _accepts[0], dict(_spent)
            loop.call_later(PERIOD, tick)

        loop.call_later(PERIOD, tick)
        create_server = loop.create_server

        async def counting_server(factory: Any, *args: Any, **kwargs: Any) -> Any:
            if not _hooked:
                _hooked.append(1)
                _hook_gateway()

            def counted() -> Any:
                _accepts[0] += 1
                return factory()

            return await create_server(counted, *args, **kwargs)

        loop.create_server = counting_server  # type: ignore[method-assign]

    def _write(written: int) -> int:
        """Append the records made since the last write. Only those: this thread holds the GIL while it
        formats, and the loop thread it measures waits meanwhile (rewriting every record every 2 s made
        stalls of its own, growing with the run, seen as the loop's lost wall-clock time)."""
        now = len(_records)
        with open(f"{os.environ['LOOP_PROBE']}.{os.getpid()}", "a", encoding="utf-8") as out:
            if not written:
                out.write("# loop probe\n")
            out.writelines(f"{t:.4f} {ms:.3f} {n} {parts}\n" for t, ms, n, parts in _records[written:now])
        return now

    def _writer() -> None:
        written = 0
        while True:
            time.sleep(2)
            written = _write(written)

    _set_policy = asyncio.set_event_loop_policy

    def _policy(policy: Any) -> None:
        if policy is not None:
            new_loop = policy.new_event_loop

            def probed() -> asyncio.AbstractEventLoop:
                loop = new_loop()
                _sample(loop)
                return loop

            policy.new_event_loop = probed
        _set_policy(policy)

    asyncio.set_event_loop_policy = _policy
    threading.Thread(target=_writer, daemon=True).start()
