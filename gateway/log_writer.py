"""Log lines written to stderr by a thread of their own, so a slow reader never stops the event loop.

stderr is a pipe in every deployment (a container runtime's, systemd's, a supervising test's), and a
write to a full pipe blocks. Written from the loop, every log line and access-log batch could stop it
for as long as the reader lags: measured in a wake storm (100 wakes on two cores, the replicas' stderr
read by a starved supervisor), a replica's loop stood still for 6-11 s at 3-8% CPU, its lease renewals
fired that late, and its wakes were taken over. Here the loop only queues the text; the writer thread
blocks instead. The queue is bounded: past ``max_queued`` chunks, text is dropped and counted, and the
count is written as a line of its own once the writer catches up (losing log lines beats stopping the
gateway). Whatever is queued is written at exit.
"""

from __future__ import annotations

import atexit
import queue
import threading
from typing import Any, TextIO

MAX_QUEUED = 10_000     # chunks: a log line, or a batch of access lines (at most 512)
DRAIN_AT_EXIT = 5.0     # seconds the exit waits for the writer to catch up


class LogWriter:
    """A file-like ``write``/``flush`` that hands text to a writer thread (see the module docstring)."""

    def __init__(self, stream: TextIO, *, max_queued: int = MAX_QUEUED) -> None:
        self._stream = stream
        self._queue: queue.Queue[str | None] = queue.Queue(max_queued)
        self._lock = threading.Lock()
        self.dropped = 0  # chunks dropped since the last report
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def write(self, text: str) -> int:
        try:
            self._queue.put_nowait(text)
        except queue.Full:
            with self._lock:
                self.dropped += 1
        return len(text)

    def flush(self) -> None:
        """Nothing to wait for: the writer flushes after each batch it writes."""

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self, timeout: float = DRAIN_AT_EXIT) -> None:
        """Write what is queued (waiting up to ``timeout``) and stop the writer."""
        if self._thread.is_alive():
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:
                return
            self._thread.join(timeout)

    def _run(self) -> None:
        get = self._queue.get
        while True:
            chunks = [get()]
            while len(chunks) < 256:  # what queued meanwhile goes in the same write
                try:
                    chunks.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in chunks
            self._write("".join(chunk for chunk in chunks if chunk is not None))
            if stop:
                return

    def _write(self, text: str) -> None:
        with self._lock:
            dropped, self.dropped = self.dropped, 0
        if dropped:
            text += (f"log-writer: {dropped} log chunk(s) dropped: stderr was not read fast enough "
                     f"(more than {self._queue.maxsize} waiting)\n")
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing to report it to
            pass


def threaded(stream: Any) -> Any:
    """``stream`` behind a :class:`LogWriter` (once)."""
    return stream if isinstance(stream, LogWriter) else LogWriter(stream)
