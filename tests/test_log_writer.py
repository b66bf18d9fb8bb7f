"""Log lines go to stderr through a writer thread (gateway/log_writer.py): a reader that lags (a full
pipe) must never stop the caller, which is the event loop; what waits is bounded, and what was
dropped is said once the reader catches up."""

from __future__ import annotations

import os
import threading

from gateway.log_writer import LogWriter


def _pipe() -> tuple[int, object]:
    read_fd, write_fd = os.pipe()
    return read_fd, os.fdopen(write_fd, "w")


def _read_all(read_fd: int) -> str:
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    return b"".join(chunks).decode()


def test_writes_return_while_nobody_reads_and_every_line_arrives_in_order() -> None:
    read_fd, stream = _pipe()
    writer = LogWriter(stream)  # type: ignore[arg-type]
    lines = [f"line {i} {'x' * 200}\n" for i in range(2_000)]  # 400 KB: six times a pipe's buffer
    done = threading.Event()

    def produce() -> None:
        for line in lines:
            writer.write(line)
        done.set()

    threading.Thread(target=produce).start()
    assert done.wait(10), "a write waited for the reader"  # nothing reads the pipe yet
    reader = threading.Thread(target=lambda: seen.append(_read_all(read_fd)))
    seen: list[str] = []
    reader.start()
    writer.close()
    stream.close()  # type: ignore[attr-defined]
    reader.join(10)
    assert seen == ["".join(lines)]


def test_past_its_bound_text_is_dropped_and_the_count_said_when_the_reader_catches_up() -> None:
    read_fd, stream = _pipe()
    writer = LogWriter(stream, max_bytes=70_100)  # type: ignore[arg-type]
    writer.write("x" * 70_000 + "\n")  # more than the pipe holds: the writer blocks on it, and it still counts
    for i in range(40):
        writer.write(f"line {i}\n")
    assert writer.dropped > 0
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.append(_read_all(read_fd)))
    reader.start()
    writer.close()
    stream.close()  # type: ignore[attr-defined]
    reader.join(10)
    (text,) = seen
    assert "log chunk(s) dropped: stderr was not read fast enough" in text
    kept = [line for line in text.splitlines() if line.startswith("line ")]
    assert 0 < len(kept) < 40 and kept == sorted(kept, key=lambda line: int(line.split()[1]))
