# The compiled build's declarations for metrics.py (gateway/_compiled.py): the front's series and batch as C struct
# members, so that a call's two counts (started as it begins, observe as it is accounted) are C calls on C fields.
# Compiled as a plain Python class it was slower than interpreted (every field a generic attribute lookup).
cimport cython
from gateway.metrics cimport Batch

cdef class GrpcMetrics:
    cdef public object calls, duration, messages, open_calls, connection_errors, connections_closed
    cdef public dict _closed
    cdef public object malformed_requests, _sent, _received
    cdef public Py_ssize_t _limit
    cdef public set _methods
    cdef public dict _series
    cdef public tuple _bounds
    cdef public dict _batch
    cdef public Py_ssize_t _to_sandbox, _to_client, open, _shown
    cdef public object _fold_soon, unobserved
    cpdef started(self)
    @cython.locals(batch=Batch, buckets=list)
    cpdef observe(self, object path, int code, double seconds, Py_ssize_t to_sandbox, Py_ssize_t to_client)
