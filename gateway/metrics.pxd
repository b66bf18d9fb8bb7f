# The compiled build's declarations for metrics.py (gateway/_compiled.py).
from gateway.proxy._exchange cimport RequestLog

cdef class RequestMetrics:
    cdef public object _metrics
    cdef public tuple _bounds
    cdef public dict _series, _batch
    cpdef record(self, RequestLog entry)
