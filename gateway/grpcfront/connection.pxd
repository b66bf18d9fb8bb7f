# The compiled build's declarations for connection.py (gateway/_compiled.py): the fields as C struct members
# (the reading half's are FrameReader's, inbound.pxd).
from gateway.grpcfront.frames cimport header_frames
from gateway.grpcfront.inbound cimport FrameReader

cdef class Connection(FrameReader):
    cdef public bint write_paused, _pause_reading
    cdef public object _transport
    cdef public list _out
    cdef public object _flush_handle
    cdef public bint _holding, _greeted
    cdef public list _drain_waiters
    cdef public object _lost
    cdef public Py_ssize_t _window
    cdef public dict _held
    cdef public Py_ssize_t _unacked
