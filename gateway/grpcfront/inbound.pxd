# The compiled build's declarations for inbound.py (gateway/_compiled.py): the connection's state the reading
# half uses, as C struct members (Connection, connection.pxd, extends it with the rest).
cimport cython
from gateway.grpcfront.frames cimport frame, u32, unpad
from gateway.grpcfront.headers cimport HeaderCodec
from gateway.grpcfront.keeper cimport Keeper
from gateway.grpcfront.stream cimport Endpoint, Stream

cdef class FrameReader(Endpoint):
    cdef public object handler
    cdef public dict streams
    cdef public bint closed, draining, goaway_received
    cdef public Py_ssize_t peer_max_streams, active
    cdef public Keeper keeper
    cdef public object _waiting, _reset_ids, _inbox
    cdef public bint _preface, _settings_seen
    cdef public object _settled
    cdef public Py_ssize_t _recv_window, _next_id, _last_peer_id
    cdef public list _block
    cdef public Py_ssize_t _block_stream, _block_size
    cdef public bint _block_end, _self_dependent
    cdef public HeaderCodec _hpack
    @cython.locals(buf="const unsigned char *", pos=Py_ssize_t, end=Py_ssize_t, size=Py_ssize_t, stop=Py_ssize_t,
                   kind=int, flags=int, stream_id=Py_ssize_t)
    cpdef _read_frames(self, bytes data)
    cpdef _frame(self, int kind, int flags, Py_ssize_t stream_id, bytes payload)
    @cython.locals(size=Py_ssize_t, stream=Stream)
    cpdef _data(self, int flags, Py_ssize_t stream_id, bytes payload)
    # what the connection provides (connection.pxd declares them again, as it overrides them; write and reset_sent
    # are Endpoint's, stream.pxd): C calls from here
    cpdef _credit(self, Py_ssize_t size)
    cpdef _close_if_drained(self)
    cpdef _headers(self, int flags, Py_ssize_t stream_id, bytes payload)
    @cython.locals(stream=Stream)
    cpdef _header_block(self, Py_ssize_t stream_id, bint end_stream, bytes block)
    @cython.locals(stream=Stream)
    cpdef _accept(self, Py_ssize_t stream_id, tuple headers, bint end_stream, bytes block)
    cpdef _start(self, Stream stream)
    cpdef bint _idle(self, Py_ssize_t stream_id)
    @cython.locals(stream=Stream, increment=Py_ssize_t)
    cpdef _window_update(self, Py_ssize_t stream_id, bytes payload)
