# The compiled build's declarations for metrics.py (gateway/_compiled.py).
cimport cython
from gateway.proxy._exchange cimport RequestLog

cdef class CacheLookups:
    cdef public Py_ssize_t hits, misses
    cdef public object metrics
    cdef public bint multiprocess
    cpdef count(self, bint hit)

cdef class Batch:
    cdef public long long count
    cdef public double total
    cdef public list buckets

cdef class RequestMetrics:
    cdef public object _metrics
    cdef public tuple _bounds
    cdef public dict _series, _batch
    cdef public bint _per_org
    @cython.locals(batch=Batch, buckets=list)
    cpdef record(self, RequestLog entry)

@cython.locals(last=Py_ssize_t, i=Py_ssize_t, bound=double)
cdef Py_ssize_t _bucket(tuple bounds, double value)
