"""MessageSizeGuard (frame-header scanner for the WebSocket splice) and close_frame."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.proxy._wsframe import MessageSizeGuard, close_frame

TEXT, BINARY, CONT, CLOSE, PING, PONG = 1, 2, 0, 8, 9, 10


# -- a local encoder, independent of the module under test ---------------------

def header(opcode: int, length: int, *, fin: bool = True, mask: bool = True,
           width: int | None = None) -> bytes:
    """A frame header; ``width`` forces the 7/16/64-bit length encoding (default: minimal)."""
    if width is None:
        width = 7 if length < 126 else 16 if length < 65536 else 64
    b0 = (0x80 if fin else 0) | opcode
    m = 0x80 if mask else 0
    if width == 7:
        assert length < 126
        out = bytes((b0, m | length))
    elif width == 16:
        out = bytes((b0, m | 126)) + length.to_bytes(2, "big")
    else:
        out = bytes((b0, m | 127)) + length.to_bytes(8, "big")
    return out + (b"\x01\x02\x03\x04" if mask else b"")


def frame(opcode: int, length: int, *, fin: bool = True, mask: bool = True,
          width: int | None = None) -> bytes:
    """A whole frame with ``length`` payload bytes (contents are irrelevant to the guard)."""
    return header(opcode, length, fin=fin, mask=mask, width=width) + b"\xa5" * length


def feed_all(guard: MessageSizeGuard, *chunks: bytes) -> list[int | None]:
    return [guard.feed(c) for c in chunks]


def parse_frame(data: bytes) -> tuple[int, bool, bool, bytes]:
    """(opcode, fin, masked, unmasked payload) of one 7-bit-length frame, checking it is whole."""
    b0, b1 = data[0], data[1]
    masked = bool(b1 & 0x80)
    length = b1 & 0x7F
    assert length < 126
    pos = 2
    key = b"\0\0\0\0"
    if masked:
        key = data[2:6]
        pos = 6
    payload = data[pos:]
    assert len(payload) == length
    payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    assert b0 & 0x70 == 0
    return b0 & 0x0F, bool(b0 & 0x80), masked, payload


# -- size boundaries ------------------------------------------------------------

@pytest.mark.parametrize(("limit", "width"), [(100, 7), (125, 7), (1000, 16), (65535, 16), (70000, 64)])
@pytest.mark.parametrize("opcode", [TEXT, BINARY])
def test_message_of_exactly_the_limit_passes(limit: int, width: int, opcode: int) -> None:
    guard = MessageSizeGuard(limit)
    assert guard.feed(frame(opcode, limit, width=width)) is None
    assert guard.feed(frame(opcode, 0)) is None   # and the stream goes on


@pytest.mark.parametrize(("limit", "width"), [(100, 7), (124, 7), (1000, 16), (65534, 16), (70000, 64)])
def test_one_byte_over_fails_on_the_header_alone(limit: int, width: int) -> None:
    guard = MessageSizeGuard(limit)
    assert guard.feed(header(BINARY, limit + 1, width=width)) == 1009


@pytest.mark.parametrize("width", [7, 16, 64])
def test_non_minimal_length_encodings_are_read(width: int) -> None:
    guard = MessageSizeGuard(10)
    assert guard.feed(frame(TEXT, 10, width=width) + frame(TEXT, 3, width=width)) is None
    assert guard.feed(header(TEXT, 11, width=width)) == 1009


def test_unmasked_frames_are_parsed_too() -> None:
    guard = MessageSizeGuard(50)
    assert guard.feed(frame(TEXT, 50, mask=False) + frame(BINARY, 7, mask=False)) is None
    assert guard.feed(header(TEXT, 51, mask=False)) == 1009


def test_zero_limit_allows_only_empty_messages() -> None:
    guard = MessageSizeGuard(0)
    assert guard.feed(frame(TEXT, 0) + frame(PING, 5)) is None
    assert guard.feed(header(BINARY, 1)) == 1009


def test_negative_limit_is_rejected() -> None:
    with pytest.raises(ValueError):
        MessageSizeGuard(-1)


def test_huge_frame_is_skipped_by_counting() -> None:
    """A 2**40-byte frame announced under a larger limit: payload chunks just count down."""
    size = 1 << 40
    guard = MessageSizeGuard(size)
    assert guard.feed(header(BINARY, size)) is None
    chunk = bytes(1 << 20)
    for _ in range(8):
        assert guard.feed(chunk) is None
    assert guard._skip == size - 8 * len(chunk)


def test_payload_bytes_that_look_like_headers_are_not_parsed() -> None:
    """The payload of an accepted frame contains what would be an oversize header."""
    guard = MessageSizeGuard(20)
    bogus = header(TEXT, 10_000)
    data = header(BINARY, len(bogus) + 2) + bogus + b"\x89\xff"
    assert guard.feed(data[:5]) is None
    assert guard.feed(data[5:]) is None
    assert guard.feed(frame(TEXT, 20)) is None


# -- fragmented messages ----------------------------------------------------------

def test_fragments_sum_over_the_limit() -> None:
    guard = MessageSizeGuard(100)
    assert guard.feed(frame(TEXT, 40, fin=False)) is None
    assert guard.feed(frame(CONT, 40, fin=False)) is None
    assert guard.feed(header(CONT, 21)) == 1009


def test_fragments_summing_to_exactly_the_limit_pass_and_the_total_resets() -> None:
    guard = MessageSizeGuard(100)
    data = frame(BINARY, 40, fin=False) + frame(CONT, 40, fin=False) + frame(CONT, 20)
    assert guard.feed(data) is None
    # the next message starts from zero
    assert guard.feed(frame(TEXT, 60, fin=False) + frame(CONT, 40)) is None
    assert guard.feed(frame(TEXT, 100)) is None


def test_interleaved_control_frames_are_allowed_and_not_counted() -> None:
    guard = MessageSizeGuard(100)
    data = (frame(TEXT, 50, fin=False) + frame(PING, 125) + frame(PONG, 125)
            + frame(CONT, 50, fin=False) + frame(PING, 0) + frame(CONT, 0))
    assert guard.feed(data) is None
    assert guard.feed(header(TEXT, 101, fin=False)) == 1009


def test_close_frame_inside_a_fragmented_message_is_fine() -> None:
    guard = MessageSizeGuard(10)
    assert guard.feed(frame(TEXT, 5, fin=False) + frame(CLOSE, 2) + frame(CONT, 5)) is None


def test_many_small_frames_in_one_chunk() -> None:
    guard = MessageSizeGuard(8)
    one = frame(BINARY, 8)
    assert guard.feed(one * 20_000) is None
    assert guard.feed(one * 100 + header(BINARY, 9) + one) == 1009


# -- protocol errors ----------------------------------------------------------------

def test_64_bit_length_with_the_top_bit_set() -> None:
    guard = MessageSizeGuard(1 << 62)
    bad = bytes((0x82, 0x80 | 127)) + ((1 << 63) + 5).to_bytes(8, "big") + b"\0\0\0\0"
    assert guard.feed(bad) == 1002


def test_top_bit_is_a_protocol_error_even_for_control_and_unlimited() -> None:
    guard = MessageSizeGuard(1 << 70)
    bad = bytes((0x82, 127)) + (1 << 63).to_bytes(8, "big")
    assert guard.feed(bad) == 1002


@pytest.mark.parametrize("opcode", [CLOSE, PING, PONG])
def test_control_frame_over_125_bytes(opcode: int) -> None:
    guard = MessageSizeGuard(10_000)
    assert guard.feed(frame(opcode, 125)) is None
    assert guard.feed(header(opcode, 126)) == 1002


@pytest.mark.parametrize("opcode", [CLOSE, PING, PONG])
def test_control_frame_with_a_16_bit_encoding_of_a_small_length_is_fine(opcode: int) -> None:
    assert MessageSizeGuard(10).feed(frame(opcode, 20, width=16)) is None


@pytest.mark.parametrize("opcode", [CLOSE, PING, PONG])
def test_fragmented_control_frame(opcode: int) -> None:
    assert MessageSizeGuard(100).feed(frame(opcode, 3, fin=False)) == 1002


@pytest.mark.parametrize("fin", [True, False])
def test_continuation_without_a_message(fin: bool) -> None:
    assert MessageSizeGuard(100).feed(frame(CONT, 3, fin=fin)) == 1002


def test_continuation_after_a_finished_message() -> None:
    guard = MessageSizeGuard(100)
    assert guard.feed(frame(TEXT, 3, fin=False) + frame(CONT, 3)) is None
    assert guard.feed(frame(CONT, 3)) == 1002


@pytest.mark.parametrize("opcode", [TEXT, BINARY])
def test_new_data_frame_inside_a_fragmented_message(opcode: int) -> None:
    guard = MessageSizeGuard(100)
    assert guard.feed(frame(TEXT, 3, fin=False)) is None
    assert guard.feed(frame(opcode, 3)) == 1002


@pytest.mark.parametrize("opcode", [3, 4, 5, 6, 7, 11, 12, 13, 14, 15])
def test_reserved_opcodes(opcode: int) -> None:
    assert MessageSizeGuard(100).feed(frame(opcode, 0)) == 1002


def test_protocol_error_wins_over_size_for_control_frames() -> None:
    assert MessageSizeGuard(10).feed(header(PING, 126)) == 1002


@pytest.mark.parametrize("b0", [0xC1, 0xA1, 0x91], ids=["RSV1 (permessage-deflate)", "RSV2", "RSV3"])
def test_a_frame_with_rsv_bits_is_refused_where_no_extension_was_negotiated(b0: int) -> None:
    """The data plane declines extensions under a limit: a frame claiming one would hide its size."""
    assert MessageSizeGuard(10).feed(bytes((b0, 0x85)) + b"\0" * 4 + b"x" * 5) == 1002


def test_rsv_bits_pass_on_a_stream_whose_extensions_were_negotiated_end_to_end() -> None:
    """The sandbox's frames are followed, not limited (rsv_ok): permessage-deflate sets RSV1."""
    guard = MessageSizeGuard(10, rsv_ok=True)
    assert guard.feed(bytes((0xC1, 0x85)) + b"\0" * 4 + b"x" * 5) is None
    assert guard.feed(bytes((0xC1, 0x8B)) + b"\0" * 4) == 1009


# -- verdicts and splits ------------------------------------------------------------

@pytest.mark.parametrize("first", [header(TEXT, 11), frame(CONT, 1)])
def test_verdict_is_sticky(first: bytes) -> None:
    guard = MessageSizeGuard(10)
    code = guard.feed(first)
    assert code in (1002, 1009)
    assert guard.verdict == code
    assert feed_all(guard, b"x" * 11, frame(TEXT, 1), b"", header(PING, 200)) == [code] * 4


def test_verdict_from_a_later_frame_in_the_same_chunk() -> None:
    guard = MessageSizeGuard(10)
    assert guard.feed(frame(TEXT, 10) + frame(PING, 1) + frame(CONT, 1) + frame(TEXT, 1)) == 1002
    assert guard.feed(frame(TEXT, 1)) == 1002


@pytest.mark.parametrize("width", [7, 16, 64])
@pytest.mark.parametrize("mask", [True, False])
def test_header_split_at_every_byte(width: int, mask: bool) -> None:
    limit = {7: 100, 16: 300, 64: 70_000}[width]
    for over in (False, True):
        data = frame(TEXT, 4) + header(BINARY, limit + over, width=width, mask=mask)
        for cut in range(1, len(data)):
            guard = MessageSizeGuard(limit)
            assert guard.feed(data[:cut]) is None
            assert guard.feed(data[cut:]) == (1009 if over else None)


def test_byte_at_a_time() -> None:
    data = (frame(TEXT, 30, fin=False) + frame(PING, 4) + frame(CONT, 200, width=64, fin=False)
            + frame(CONT, 70, width=16) + frame(BINARY, 300))
    guard = MessageSizeGuard(300)
    assert [guard.feed(data[i:i + 1]) for i in range(len(data))] == [None] * len(data)
    assert guard.feed(header(CONT, 0)) == 1002


def test_empty_feeds_change_nothing() -> None:
    guard = MessageSizeGuard(10)
    data = frame(TEXT, 10)
    assert feed_all(guard, b"", data[:1], b"", data[1:3], b"", data[3:], b"") == [None] * 7
    assert guard.feed(header(TEXT, 11)) == 1009


# -- property: splitting never changes the verdict ------------------------------------

LIMIT = 150

frames_st = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([TEXT, BINARY, CONT]), st.integers(0, LIMIT + 10),
                  st.booleans(), st.sampled_from([None, 16, 64])),
        st.tuples(st.sampled_from([PING, PONG]), st.integers(0, 125),
                  st.just(True), st.sampled_from([None, 16, 64])),
    ),
    min_size=1, max_size=8,
)


def reference_verdict(frames: list[tuple[int, int, bool, int | None]], limit: int) -> int | None:
    """A straightforward model of the rules, frame by frame."""
    in_message, total = False, 0
    for opcode, length, fin, _ in frames:
        if opcode >= 8:
            continue
        if opcode == CONT:
            if not in_message:
                return 1002
            total += length
        else:
            if in_message:
                return 1002
            total = length
        if total > limit:
            return 1009
        in_message = not fin
    return None


@settings(max_examples=300, deadline=None)
@given(frames=frames_st, cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_splitting_gives_the_same_verdict_as_whole(
    frames: list[tuple[int, int, bool, int | None]], cuts: list[int],
) -> None:
    data = b"".join(frame(op, n, fin=fin, width=w) for op, n, fin, w in frames)
    whole = MessageSizeGuard(LIMIT).feed(data)
    assert whole == reference_verdict(frames, LIMIT)

    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]
    guard = MessageSizeGuard(LIMIT)
    results = [guard.feed(p) for p in pieces]
    verdicts = [r for r in results if r is not None]
    assert (verdicts[0] if verdicts else None) == whole
    if verdicts:   # once given, every later call repeats it
        first = results.index(verdicts[0])
        assert results[first:] == [whole] * (len(results) - first)


# -- close_frame ------------------------------------------------------------------------

@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize(("code", "reason"), [(1009, "message too big"), (1002, ""), (1000, "héllo ✓")])
def test_close_frame_round_trips(code: int, reason: str, masked: bool) -> None:
    data = close_frame(code, reason, masked=masked)
    opcode, fin, was_masked, payload = parse_frame(data)
    assert (opcode, fin, was_masked) == (CLOSE, True, masked)
    assert int.from_bytes(payload[:2], "big") == code
    assert payload[2:].decode("utf-8") == reason


def test_masked_close_frame_uses_urandom_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: b"\xff\x00\xaa\x55"[:n])
    data = close_frame(1009, "ab", masked=True)
    assert data[2:6] == b"\xff\x00\xaa\x55"
    assert data[6:] == bytes((0x03 ^ 0xFF, 0xF1 ^ 0x00, ord("a") ^ 0xAA, ord("b") ^ 0x55))


def test_masked_close_frames_differ_in_key() -> None:
    keys = {close_frame(1000, "x", masked=True)[2:6] for _ in range(8)}
    assert len(keys) > 1


@pytest.mark.parametrize("masked", [True, False])
def test_long_reason_is_truncated_to_a_125_byte_payload(masked: bool) -> None:
    _, _, _, payload = parse_frame(close_frame(1009, "r" * 500, masked=masked))
    assert len(payload) == 125
    assert payload[2:] == b"r" * 123


def test_truncation_keeps_the_reason_valid_utf8() -> None:
    _, _, _, payload = parse_frame(close_frame(1009, "é" * 100, masked=False))  # 2 bytes each
    assert len(payload) == 2 + 122
    assert payload[2:].decode("utf-8") == "é" * 61


def test_close_frame_is_accepted_by_the_guard() -> None:
    assert MessageSizeGuard(0).feed(close_frame(1009, "x" * 300, masked=True)) is None


@pytest.mark.parametrize("code", [0, 999, 5000, 70000])
def test_close_code_out_of_range(code: int) -> None:
    with pytest.raises(ValueError):
        close_frame(code, masked=False)
