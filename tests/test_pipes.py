"""A child's report read from a pipe (gateway/providers/_pipes.py) closes its descriptor once.

uvloop's ``connect_read_pipe`` closed it twice (MagicStack/uvloop#763): a descriptor another
thread opened in between was closed under its owner, which surfaced as a sporadic ``[Errno 9]
Bad file descriptor`` in a sandbox's ``prepare`` (a worker thread) during a wake storm. The read
must have closed the pipe when it returns, with nothing left behind that closes the number again
(the old way left it to the transport and the file object, and failed here), and a descriptor
opened afterwards, which the kernel gives that number, must survive loop turns and collections;
on both event loops."""

from __future__ import annotations

import asyncio
import gc
import os
import warnings

import pytest
import uvloop

from gateway.providers._pipes import read_until


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


async def _turns_and_collections() -> None:
    for _ in range(3):
        await asyncio.sleep(0)
        gc.collect()


async def _read_then_open() -> tuple[bytes, int, int]:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"LISTENING a b\nmore")
    os.close(write_fd)
    data = await read_until(read_fd, lambda got: b"\n" in got)
    if not _closed(read_fd):  # uvloop's transport closed it a loop turn later, then again
        await _turns_and_collections()
    bystander = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: the pipe's, once freed
    await _turns_and_collections()
    return data, read_fd, bystander


def _collect_earlier_garbage() -> None:
    """Collect what earlier tests left to the collector before this test takes descriptor numbers.

    A socket an earlier test left unclosed (a refused connect under load, say) would otherwise be
    finalised by this test's collections: its number freed in the middle of the check, and its
    ResourceWarning reported as this test's.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_the_pipe_is_closed_once_and_a_later_descriptor_survives(run) -> None:
    _collect_earlier_garbage()
    data, read_fd, bystander = run(_read_then_open())
    try:
        assert data.startswith(b"LISTENING a b\n")
        assert bystander == read_fd, "the check needs the freed number to be handed out again"
        os.fstat(bystander)  # raises EBADF when the read closed the number a second time
    finally:
        os.close(bystander)


async def _read_slowly() -> bytes:
    read_fd, write_fd = os.pipe()

    async def trickle() -> None:
        for part in (b'{"child', b'-pid": 7', b"}\n"):
            await asyncio.sleep(0)
            os.write(write_fd, part)
        os.close(write_fd)

    writer = asyncio.ensure_future(trickle())
    data = await read_until(read_fd, lambda got: got.rstrip().endswith(b"}"))
    await writer
    with pytest.raises(OSError):
        os.fstat(read_fd)  # closed by the read (nothing else opened it meanwhile)
    return data


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_report_written_in_parts_is_read_whole(run) -> None:
    assert run(_read_slowly()) == b'{"child-pid": 7}\n'


def test_eof_before_the_report_gives_what_came() -> None:
    async def main() -> bytes:
        read_fd, write_fd = os.pipe()
        os.write(write_fd, b"partial")
        os.close(write_fd)
        return await read_until(read_fd, lambda got: b"\n" in got)

    assert uvloop.run(main()) == b"partial"
