"""HPACK for one connection (the ``hpack`` library), remembering header blocks that repeat.

A gRPC client sends the same request head call after call, and a sandbox the
same response head and trailers; after the first, every field of such a block
is an index into the dynamic table, so the block's bytes repeat exactly. The
``hpack`` library (pure Python) decodes and encodes each again, field by field:
profiled, a quarter of the gateway's CPU per relayed unary call.

:class:`HeaderCodec` remembers, per connection and direction, what a block of
indexed fields only decodes to, and what a header list encodes to when its
encoding was indexed fields only. That is sound because such a block neither
reads nor changes anything but the dynamic table, and the table changes only
through a block that inserts or resizes (a literal "with incremental indexing",
a table size update) or through our SETTINGS_HEADER_TABLE_SIZE: any block that
is not indexed fields only forgets everything remembered in that direction.
"""

from __future__ import annotations

from hpack import Decoder, Encoder

Headers = list[tuple[bytes, bytes]]

# One-byte indexed fields (RFC 7541 6.1): 0x81-0xFE are indexes 1-126; 0x80 (index 0) is an error and 0xFF
# starts a longer index. A block of only these bytes is indexed fields only.
_ONE_BYTE_INDEXES = bytes(range(0x81, 0xFF))
_REMEMBERED = 64  # distinct blocks per direction; more and the memo starts over


def _indexed_only(block: bytes) -> bool:
    return not block.translate(None, _ONE_BYTE_INDEXES)


class HeaderCodec:
    """One connection's HPACK decoder and encoder, with their repeated blocks remembered."""

    __slots__ = ("_decoder", "_encoder", "_decoded", "_encoded")

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = Decoder(max_header_list_size=max_header_list_size)
        self._encoder = Encoder()
        self._decoded: dict[bytes, Headers] = {}
        self._encoded: dict[tuple[tuple[bytes | str, bytes | str], ...], bytes] = {}

    def decode(self, block: bytes) -> Headers:
        """The header list of ``block`` (a new list each time). Raises hpack's errors for a bad block."""
        headers = self._decoded.get(block)
        if headers is not None:
            return list(headers)
        headers = self._decoder.decode(block, raw=True)  # type: ignore[assignment]
        if _indexed_only(block):
            if len(self._decoded) >= _REMEMBERED:
                self._decoded.clear()
            self._decoded[block] = headers
            return list(headers)
        self._decoded.clear()
        return headers

    def encode(self, headers: Headers | list[tuple[str, str]]) -> bytes:
        key = tuple(headers)
        block = self._encoded.get(key)
        if block is not None:
            return block
        block = self._encoder.encode(headers)
        if _indexed_only(block):
            if len(self._encoded) >= _REMEMBERED:
                self._encoded.clear()
            self._encoded[key] = block
        else:
            self._encoded.clear()
        return block

    def peer_table_size(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: our encoder may use up to that (it sends the update)."""
        self._encoded.clear()
        self._encoder.header_table_size = size
