# The compiled build's declarations for _downstream.py (gateway/_compiled.py).
from gateway.proxy._exchange cimport Exchange
from gateway.proxy._request cimport RequestReader
from gateway.proxy._upstream cimport UpstreamConnection, UpstreamPool

cdef class DownstreamConnection(RequestReader):
    cpdef refuse_connection(self, str bound)
    cpdef pause(self, int bit)
    cpdef resume(self, int bit)
    cpdef _flush_up(self)
    cpdef begin(self, Exchange ex, bint batch=*)
    cpdef attach(self, Exchange ex, object route, UpstreamConnection conn, bint batch)
    cpdef fail(self, Exchange ex, object exc)
    cpdef _send(self, object data)
    cpdef finish(self, Exchange ex, bint close)
