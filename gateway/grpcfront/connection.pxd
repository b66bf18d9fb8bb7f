# The compiled build's declarations for connection.py (gateway/_compiled.py): the fields as C struct members
# (the reading half's are FrameReader's, inbound.pxd).
cimport cython
from gateway.grpcfront.frames cimport header_frames
from gateway.grpcfront.inbound cimport FrameReader
from gateway.grpcfront.stream cimport Stream

cdef class Connection(FrameReader):
    cdef public bint _pause_reading
    cdef public object _transport
    cdef public list _out
    cdef public object _flush_handle
    cdef public bint _holding, _greeted, _reading
    cdef public list _after
    cdef public list _drain_waiters
    cdef public object _lost
    cdef public Py_ssize_t _window
    cdef public Py_ssize_t _unacked
    cpdef write(self, bytes data)
    cpdef reset_sent(self, Py_ssize_t stream_id, Py_ssize_t code)
    cpdef _credit(self, Py_ssize_t size)
    cpdef write_headers(self, Py_ssize_t stream_id, object headers, bint end_stream)
    cpdef hold(self)
    cpdef flush(self)
    cpdef soon(self, object callback)
    cpdef _run_after(self)
    cpdef _send(self)
    cpdef forget(self, Stream stream)
    cpdef released(self, Stream stream)
    @cython.locals(stream=Stream)
    cpdef ack(self, Py_ssize_t stream_id, Py_ssize_t size)
    cpdef _close_if_drained(self)
    cpdef Stream open_stream(self, object headers, object owner)
