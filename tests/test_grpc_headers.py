"""The gRPC front's HPACK memo (gateway/grpcfront/headers.py): remembered blocks never outlive the table state
they were decoded or encoded under. An independent ``hpack`` peer checks every block, both ways."""

from __future__ import annotations

import random

import pytest
from hpack import Decoder, Encoder, NeverIndexedHeaderTuple

from gateway.grpcfront.headers import HeaderCodec, _indexed_only, _table_neutral

POOL = [[(b":status", b"200"), (b"content-type", b"application/grpc")],
        [(b"grpc-status", b"0")],
        [(b"grpc-status", b"0"), (b"grpc-message", b"ok")],
        [(b":method", b"POST"), (b":path", b"/a.B/C"), (b"x-sandbox-id", b"ses-1")]]


def test_an_index_that_names_another_field_after_an_insert_is_decoded_anew():
    peer, codec = Encoder(), HeaderCodec(65536)
    assert codec.decode(peer.encode([(b"a", b"1")])) == ((b"a", b"1"),)  # inserted at index 62
    first = peer.encode([(b"a", b"1")])
    assert first == b"\xbe" and codec.decode(first) == ((b"a", b"1"),)  # indexed only: remembered
    assert codec.decode(peer.encode([(b"b", b"2")])) == ((b"b", b"2"),)  # inserted at 62: (a, 1) moves to 63
    again = peer.encode([(b"b", b"2")])
    assert again == first and codec.decode(again) == ((b"b", b"2"),)


def test_a_remembered_block_decodes_to_one_immutable_tuple():
    """Shared by every call that receives the block (no copy per call): a tuple, which no caller can change."""
    codec, peer = HeaderCodec(65536), Encoder()
    codec.decode(peer.encode(POOL[0]))
    block = peer.encode(POOL[0])
    got = codec.decode(block)
    assert isinstance(got, tuple) and got == tuple(POOL[0])
    assert codec.decode(bytes(block)) is got


def test_a_tuple_encoded_before_is_known_by_identity_until_the_encoder_changes():
    """The sandbox's remembered head passed on to the client: one lookup by id, and never a block made under
    another state of the encoder's table (an insert or the peer's table size forgets it)."""
    codec, decoder = HeaderCodec(65536), Decoder()
    head = tuple(POOL[0])
    assert decoder.decode(codec.encode(head), raw=True) == POOL[0]  # inserted into the table
    block = codec.encode(head)
    assert codec._by_id[id(head)] == (head, block) and decoder.decode(block, raw=True) == POOL[0]
    decoder.decode(codec.encode([(b"x-new", b"1")]))  # an insert: what was encoded under the old table is forgotten
    assert not codec._by_id and decoder.decode(codec.encode(head), raw=True) == POOL[0]
    decoder.decode(codec.encode(head))
    codec.peer_table_size(0)  # our table emptied: the next block starts with the size update, and says it all
    assert not codec._by_id
    again = codec.encode(head)
    assert again[:1] == b"\x20" and decoder.decode(again, raw=True) == POOL[0]


def test_a_list_is_never_known_by_identity():
    """A list can change after it was encoded: only a tuple's identity names its fields."""
    codec, decoder = HeaderCodec(65536), Decoder()
    head = list(POOL[1])
    decoder.decode(codec.encode(head))
    decoder.decode(codec.encode(head))
    assert not codec._by_id
    head.append((b"grpc-message", b"changed"))
    assert decoder.decode(codec.encode(list(POOL[1])), raw=True) == POOL[1]
    assert decoder.decode(codec.encode(head), raw=True) == POOL[1] + [(b"grpc-message", b"changed")]


def test_a_decoded_tuple_passed_on_matches_an_independent_peer_however_tables_change():
    """The relay's path: a sandbox's block decoded (remembered: the same tuple) and encoded for a client (known by
    that tuple's identity), while both peers' tables change under it."""
    rng = random.Random(5)
    upstream, downstream = HeaderCodec(65536), HeaderCodec(65536)
    sandbox, client = Encoder(), Decoder()
    for step in range(3000):
        headers = list(rng.choice(POOL))
        if rng.random() < 0.1:
            headers.append((b"x-seen-once", b"%d" % rng.randrange(1000)))
        if rng.random() < 0.01:
            size = rng.choice([0, 256, 4096])
            sandbox.header_table_size = size
            downstream.peer_table_size(size)
        decoded = upstream.decode(sandbox.encode(headers))
        assert decoded == tuple(headers), step
        assert client.decode(downstream.encode(decoded), raw=True) == headers, step


def test_random_traffic_both_ways_matches_an_independent_peer():
    rng = random.Random(7)
    codec = HeaderCodec(65536)
    peer_encoder, peer_decoder = Encoder(), Decoder()
    for step in range(3000):
        headers = list(rng.choice(POOL))
        if rng.random() < 0.15:  # a value seen once (a deadline, a new sandbox): a literal, often inserted
            headers.append((b"grpc-timeout", b"%dm" % rng.randrange(1000)))
        if rng.random() < 0.01:
            size = rng.choice([0, 256, 4096])
            peer_encoder.header_table_size = size  # what SETTINGS_HEADER_TABLE_SIZE does, each way
            peer_decoder.max_allowed_table_size = 4096
            codec.peer_table_size(size)
        assert codec.decode(peer_encoder.encode(headers)) == tuple(headers), step
        assert peer_decoder.decode(codec.encode(headers), raw=True) == headers, step


@pytest.mark.parametrize(("block", "neutral"), [
    pytest.param(b"\x88\xbe", True, id="indexed fields"),
    pytest.param(b"\x0f\x0d\x02" + b"64", True, id="literal without indexing, name by index 28 (content-length)"),
    pytest.param(b"\x00\x0bgrpc-status\x010", True, id="literal without indexing, new name"),
    pytest.param(b"\x10\x0dauthorization\x83abc\x88", True, id="never indexed, Huffman flag, then indexed"),
    pytest.param(b"\x0f\x0d\x7f\x01" + b"x" * 128, True, id="a value length over the 7-bit prefix"),
    pytest.param(b"\x88\x40\x01a\x011", False, id="literal with incremental indexing"),
    pytest.param(b"\x5f\x08\x10application/grpc", False, id="incremental indexing, name by index"),
    pytest.param(b"\x3f\xe1\x1f\x88", False, id="dynamic table size update"),
    pytest.param(b"\x00\x0bgrpc-status\x05", False, id="cut short inside a value"),
    pytest.param(b"\x0f", False, id="cut short inside a name index"),
])
def test_which_blocks_leave_the_dynamic_table_as_it_was(block, neutral):
    assert _table_neutral(block) is neutral


def test_a_block_of_literals_not_indexed_is_remembered_and_forgotten_when_the_table_changes():
    """nghttp2 (h2load) sends content-length, grpc-core its grpc-status and grpc-message, as literals it does
    not index: their blocks repeat byte for byte, and decoding them anew each call was a quarter of the front's
    CPU per unary call."""
    peer, codec = Encoder(), HeaderCodec(65536)
    codec.decode(peer.encode([(b"content-type", b"application/grpc")]))  # inserted
    block = peer.encode([(b"content-type", b"application/grpc"), NeverIndexedHeaderTuple(b"grpc-status", b"0")])
    assert _table_neutral(block) and not _indexed_only(block)  # what alone was remembered before
    assert codec.decode(block) == ((b"content-type", b"application/grpc"), (b"grpc-status", b"0"))
    assert block in codec._decoded  # remembered: the next identical block is not decoded again
    codec.decode(peer.encode([(b"x-new", b"1")]))  # an insert: everything remembered is forgotten
    assert block not in codec._decoded


def test_random_traffic_with_literals_not_indexed_matches_an_independent_peer():
    """As above, with fields the peer never indexes (their blocks are remembered too) among those it does."""
    rng = random.Random(11)
    codec, peer_encoder = HeaderCodec(65536), Encoder()
    for step in range(3000):
        headers = list(rng.choice(POOL))
        sent = [NeverIndexedHeaderTuple(name, value) if rng.random() < 0.3 else (name, value)
                for name, value in headers]
        if rng.random() < 0.1:
            headers.append((b"grpc-timeout", b"%dm" % rng.randrange(1000)))
            sent.append(headers[-1])
        assert codec.decode(peer_encoder.encode(sent)) == tuple(headers), step
