"""The gRPC front's HPACK memo (gateway/grpcfront/headers.py): remembered blocks never outlive the table state
they were decoded or encoded under. An independent ``hpack`` peer checks every block, both ways."""

from __future__ import annotations

import random

from hpack import Decoder, Encoder

from gateway.grpcfront.headers import HeaderCodec

POOL = [[(b":status", b"200"), (b"content-type", b"application/grpc")],
        [(b"grpc-status", b"0")],
        [(b"grpc-status", b"0"), (b"grpc-message", b"ok")],
        [(b":method", b"POST"), (b":path", b"/a.B/C"), (b"x-sandbox-id", b"ses-1")]]


def test_an_index_that_names_another_field_after_an_insert_is_decoded_anew():
    peer, codec = Encoder(), HeaderCodec(65536)
    assert codec.decode(peer.encode([(b"a", b"1")])) == [(b"a", b"1")]  # inserted at index 62
    first = peer.encode([(b"a", b"1")])
    assert first == b"\xbe" and codec.decode(first) == [(b"a", b"1")]  # indexed only: remembered
    assert codec.decode(peer.encode([(b"b", b"2")])) == [(b"b", b"2")]  # inserted at 62: (a, 1) moves to 63
    again = peer.encode([(b"b", b"2")])
    assert again == first and codec.decode(again) == [(b"b", b"2")]


def test_a_decoded_list_is_the_callers_own():
    codec, peer = HeaderCodec(65536), Encoder()
    codec.decode(peer.encode(POOL[0]))
    block = peer.encode(POOL[0])
    got = codec.decode(block)
    got.append((b"x", b"y"))
    assert codec.decode(block) == POOL[0]


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
        assert codec.decode(peer_encoder.encode(headers)) == headers, step
        assert peer_decoder.decode(codec.encode(headers), raw=True) == headers, step
