"""Log lines written to stderr by a thread of their own, so a slow reader never stops the event loop.

stderr is a pipe in every deployment (a container runtime's, systemd's, a supervising test's), and a
write to a full pipe blocks. Written from the loop, every log line and access-log batch could stop it
for as long as the reader lags: measured in a wake storm (100 wakes on two cores, the replicas' stderr
read by a starved supervisor), a replica's loop stood still for 6-11 s at 3-8% CPU, its lease renewals
fired that late, and its wakes were taken over. Here the loop only queues the text; the writer thread
blocks instead. What waits is bounded in bytes (a chunk is a line or a batch of up to 512 access lines):
past ``max_bytes`` not yet written, text is dropped and counted, and the count is written as a line of
its own once the writer catches up (losing log lines beats stopping the gateway, or its memory).
Whatever is queued is written at exit.
"""

from __future__ import annotations

import atexit
import queue
import threading
from typing import Any, TextIO

MAX_BYTES = 16 * 1024 * 1024  # characters queued and not yet written
DRAIN_AT_EXIT = 5.0     # seconds the exit waits for the writer to catch up


class LogWriter:
    """A file-like ``write``/``flush`` that hands text to a writer thread (see the module docstring)."""

    def __init__(self, stream: TextIO, *, max_bytes: int = MAX_BYTES) -> None:
        self._stream = stream
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._max_bytes = max_bytes
        self._pending = 0  # characters queued or being written
        self.dropped = 0  # chunks dropped since the last report
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def write(self, text: str) -> int:
        with self._lock:
            if self._pending + len(text) > self._max_bytes:
                self.dropped += 1
                return len(text)
            self._pending += len(text)
        self._queue.put(text)
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
            self._queue.put(None)
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
            text = "".join(chunk for chunk in chunks if chunk is not None)
            self._write(text)
            with self._lock:
                self._pending -= len(text)  # after the write: text the stream holds up still counts
            if stop:
                return

    def _write(self, text: str) -> None:
        with self._lock:
            dropped, self.dropped = self.dropped, 0
        if dropped:
            text += (f"log-writer: {dropped} log chunk(s) dropped: stderr was not read fast enough "
                     f"(more than {self._max_bytes} characters waiting)\n")
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing to report it to
            pass


def threaded(stream: Any) -> Any:
    """``stream`` behind a :class:`LogWriter` (once)."""
    return stream if isinstance(stream, LogWriter) else LogWriter(stream)
