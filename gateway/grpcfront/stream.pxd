# The compiled build's declarations for stream.py (gateway/_compiled.py): the fields as C struct members.
from gateway.grpcfront.frames cimport frame, window_update
cimport cython
from gateway.grpcfront.relay cimport RelayBuffer, scan

cdef class Stream

# What a stream uses of its connection (FrameReader extends it, Connection overrides the methods): Stream.conn is
# typed, though connection.pxd cannot be cimported here (it cimports Stream).
cdef class Endpoint:
    cdef public bint client_side, write_paused
    cdef public Py_ssize_t send_window, peer_initial_window, peer_max_frame
    cdef public object loop
    cdef public set blocked
    cpdef write(self, bytes data)
    cpdef reset_sent(self, Py_ssize_t stream_id, Py_ssize_t code)
    cpdef write_headers(self, Py_ssize_t stream_id, object headers, bint end_stream)
    cpdef forget(self, Stream stream)
    cpdef released(self, Stream stream)
    cpdef ack(self, Py_ssize_t stream_id, Py_ssize_t size)
    cpdef hold(self)
    cpdef flush(self)
    cpdef soon(self, object callback)

cdef class Stream:
    cdef public Endpoint conn
    cdef public Py_ssize_t id
    cdef public object headers, trailers
    cdef public RelayBuffer buffer
    cdef public Py_ssize_t send_window, recv_window, _unacked
    cdef public bint local_closed, remote_closed, gone, refused
    cdef public object owner, _head_waiter, _window_waiter
    cdef public bint released
    cdef public object expected, reset_code, on_head
    cdef public Py_ssize_t held
    cpdef send_headers(self, object headers, bint end_stream=*)
    cpdef bint takes_now(self, Py_ssize_t size)
    cpdef send_now(self, bytes piece, bint end_stream=*)
    cpdef received_headers(self, tuple headers, bint end_stream)
    cpdef _wake_head(self)
    cpdef counted(self, Py_ssize_t size, bint end_stream)
    cpdef received_end(self)
    cpdef release(self)
    cpdef reset(self, Py_ssize_t code=*)
    cpdef ack(self, Py_ssize_t size)
    cpdef _end_local(self)
    cpdef window_opened(self)

@cython.locals(buffer=RelayBuffer, size=Py_ssize_t, data=bytes)
cpdef object relay_now(Stream src, Stream dst, bint end_stream=*)
