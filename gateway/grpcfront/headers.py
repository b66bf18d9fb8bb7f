"""HPACK for one connection (the ``hpack`` library), remembering header blocks that repeat.

A gRPC client sends the same request head call after call, and a sandbox the
same response head and trailers; after the first, such a block's fields are
indexes into the dynamic table or literals its encoder chose not to index
(nghttp2, so h2load, sends content-length so; grpc-core its grpc-status and
grpc-message), so the block's bytes repeat exactly. The ``hpack`` library (pure
Python) decodes and encodes each again, field by field: profiled, a quarter of
the gateway's CPU per relayed unary call (and 36 ``log.debug`` calls per call).

:class:`HeaderCodec` remembers, per connection and direction, what a block that
leaves the dynamic table as it was decodes to, and what a header list encodes to
when its encoding was indexed fields only. That is sound because such a block
reads nothing but the dynamic table and its own bytes, and the table changes only
through a block that inserts or resizes (a literal "with incremental indexing",
a table size update, RFC 7541 6.2.1 and 6.3) or through our
SETTINGS_HEADER_TABLE_SIZE: any other block forgets everything remembered in
that direction.

A remembered decoding is one tuple, returned as it is each time (immutable, so shared safely), and an encoding is
remembered by the identity of a tuple as well as by its fields: the sandbox's remembered response head, passed on
to the client as it was decoded, and the front's remembered request head for the sandbox (``head.sandbox_head``)
then cost an encoder one dict lookup by ``id``, not a hash and a comparison of every field (with the tuple kept in
the memo, its ``id`` cannot name another object while it is there).
"""

from __future__ import annotations

from hpack import Decoder, Encoder

Headers = list[tuple[bytes, bytes]]
Decoded = tuple[tuple[bytes, bytes], ...]

# One-byte indexed fields (RFC 7541 6.1): 0x81-0xFE are indexes 1-126; 0x80 (index 0) is an error and 0xFF
# starts a longer index. A block of only these bytes is indexed fields only.
_ONE_BYTE_INDEXES = bytes(range(0x81, 0xFF))
_REMEMBERED = 64  # distinct blocks per direction; more and the memo starts over


def _indexed_only(block: bytes) -> bool:
    return not block.translate(None, _ONE_BYTE_INDEXES)


def _integer(block: bytes, pos: int, mask: int) -> tuple[int, int]:
    """The integer with a ``mask``-bit prefix at ``pos`` (RFC 7541 5.1), and where what follows begins.
    Raises IndexError past the block's end (the block is then not remembered: hpack's decoder refused it)."""
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _table_neutral(block: bytes) -> bool:
    """``block`` neither inserts into nor resizes the dynamic table: indexed fields and literals "without
    indexing" or "never indexed" only (RFC 7541 6.1, 6.2.2, 6.2.3). Only called for a block that decoded."""
    if _indexed_only(block):
        return True
    pos, end = 0, len(block)
    try:
        while pos < end:
            byte = block[pos]
            if byte & 0x80:                  # indexed field
                pos = _integer(block, pos, 0x7F)[1]
            elif byte & 0xE0:                # 01: literal with incremental indexing; 001: table size update
                return False
            else:                            # 0000 / 0001: literal not indexed; name index 0 means a literal name
                named = byte & 0x0F
                pos = _integer(block, pos, 0x0F)[1]
                for _ in range(1 if named else 2):
                    length, pos = _integer(block, pos, 0x7F)
                    pos += length
    except IndexError:
        return False
    return pos == end


class HeaderCodec:
    """One connection's HPACK decoder and encoder, with their repeated blocks remembered."""

    __slots__ = ("_decoder", "_encoder", "_decoded", "_encoded", "_checked", "_by_id")

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = Decoder(max_header_list_size=max_header_list_size)
        self._encoder = Encoder()
        self._decoded: dict[bytes, Decoded] = {}
        self._checked: dict[bytes, tuple[str | None, int | None]] = {}  # request_problem of a remembered block
        self._encoded: dict[tuple[tuple[bytes | str, bytes | str], ...], bytes] = {}
        self._by_id: dict[int, tuple[Decoded, bytes]] = {}  # id(tuple): the tuple, its block (as _encoded)

    def decode(self, block: bytes) -> Decoded:
        """The header list of ``block``, as a tuple: the same tuple each time while the block is remembered.
        Raises hpack's errors for a bad block."""
        headers = self._decoded.get(block)
        if headers is not None:
            return headers
        headers = tuple(self._decoder.decode(block, raw=True))
        if _table_neutral(block):
            if len(self._decoded) >= _REMEMBERED:
                self._decoded.clear()
                self._checked.clear()
            self._decoded[block] = headers
            return headers
        self._decoded.clear()
        self._checked.clear()
        return headers

    def check_request(self, block: bytes, headers: Decoded) -> tuple[str | None, int | None]:
        """:func:`request_problem` of ``headers``, just decoded from ``block``: remembered with the block's
        decoding (the same block is then the same head), so a repeated request head is checked once."""
        result = self._checked.get(block)
        if result is None:
            result = request_problem(headers)
            if block in self._decoded:
                self._checked[block] = result
        return result

    def encode(self, headers: Decoded | Headers | list[tuple[str, str]]) -> bytes:
        """The block for ``headers``. One whose encoding was indexed fields only is remembered by its fields, and a
        tuple also by its identity (``_by_id``: looked up first)."""
        entry = self._by_id.get(id(headers))
        if entry is not None and entry[0] is headers:
            return entry[1]
        key = tuple(headers)
        block = self._encoded.get(key)
        if block is None:
            block = self._encoder.encode(headers)
            if not _indexed_only(block):
                self._forget_encoded()
                return block
            if len(self._encoded) >= _REMEMBERED:
                self._forget_encoded()
            self._encoded[key] = block
        if key is headers:  # a tuple (tuple() of one is itself): immutable, so its identity names its fields
            if len(self._by_id) >= _REMEMBERED:
                self._by_id.clear()
            self._by_id[id(headers)] = (key, block)
        return block

    def _forget_encoded(self) -> None:
        self._encoded.clear()
        self._by_id.clear()

    def peer_table_size(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: our encoder may use up to that (it sends the update)."""
        self._forget_encoded()
        self._encoder.header_table_size = size


# -- what a request head may be (RFC 9113 8.2-8.3) ----------------------------------------------------------
# A field name is lower-case visible ASCII (8.2.1: no 0x00-0x20, no 0x41-0x5A, no 0x7F-0xFF) and not empty;
# a colon only as a pseudo-header's first byte. A value has no NUL, CR or LF and no whitespace at either end.
_NAME_BYTES = bytes(b for b in range(0x21, 0x7F) if not 0x41 <= b <= 0x5A and b != 0x3A)
_VALUE_FORBIDDEN = b"\x00\r\n"
_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_REQUIRED_PSEUDO = frozenset((b":method", b":scheme", b":path"))
# Connection-specific fields make an HTTP/2 message malformed (8.2.2); TE is allowed as "trailers" only.
CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                 b"upgrade"))


def _name_problem(name: bytes) -> str | None:
    if not name or name.translate(None, _NAME_BYTES):
        shown = name.decode("ascii", "backslashreplace")[:60]
        if name != name.lower():
            return f"the field name {shown!r} has upper-case letters (HTTP/2 names are lower-case)"
        return f"the field name {shown!r} is empty or has bytes a field name may not have"
    return None


def _value_problem(name: bytes, value: bytes) -> str | None:
    if value and (value[:1] in b" \t" or value[-1:] in b" \t" or value != value.translate(None, _VALUE_FORBIDDEN)):
        return f"the value of {name.decode('ascii', 'backslashreplace')[:60]} has NUL, CR, LF or outer whitespace"
    return None


def request_problem(headers: Headers) -> tuple[str | None, int | None]:
    """What makes ``headers`` a malformed request head (RFC 9113 8.2-8.3), or None; and its content-length.

    A malformed request is a stream error PROTOCOL_ERROR (8.1.1), refused before a call begins: so no
    field a client spells another way (``Authorization`` in capitals, a second ``:path``) reaches the
    admission rules or the sandbox, which compare exact lower-case names.
    """
    seen: set[bytes] = set()
    regular = False
    length: int | None = None
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                return f"the pseudo-header {name[:20]!r} comes after a regular field", None
            if name not in _REQUEST_PSEUDO:
                return f"{name[:20]!r} is not a request pseudo-header", None
            if name in seen:
                return f"the pseudo-header {name.decode()} is given twice", None
            seen.add(name)
            if not value and name == b":path":
                return "the :path pseudo-header is empty", None
        else:
            regular = True
            problem = _name_problem(name)
            if problem is not None:
                return problem, None
            if name in CONNECTION_SPECIFIC:
                return f"the connection-specific field {name.decode()} is not allowed in HTTP/2", None
            if name == b"te" and value != b"trailers":
                return "te may only be trailers in HTTP/2", None
            if name == b"content-length":
                if length is not None or not value.isdigit():
                    return "content-length must be one number", None
                length = int(value)
        problem = _value_problem(name, value)
        if problem is not None:
            return problem, None
    if not _REQUIRED_PSEUDO <= seen:
        return "a request needs :method, :scheme and :path", None
    return None, length


def trailers_problem(headers: Headers) -> str | None:
    """What makes ``headers`` malformed as a request's trailers: pseudo-headers (8.1), bad names or values."""
    for name, value in headers:
        if name[:1] == b":":
            return f"the pseudo-header {name[:20]!r} in trailers"
        problem = _name_problem(name) or _value_problem(name, value)
        if problem is not None:
            return problem
        if name in CONNECTION_SPECIFIC:
            return f"the connection-specific field {name.decode()} is not allowed in HTTP/2"
    return None
