# The compiled build's declarations for _request.py (gateway/_compiled.py).
from gateway.proxy._exchange cimport Exchange
from gateway.proxy._keys cimport KeyedRequests

cdef class RequestReader(KeyedRequests):
    # on_header's kinds of header: C calls in the compiled build (one per header that is not forwarded as is)
    cpdef credential_header(self, Exchange ex, int code, bytes value)
    cpdef framing_header(self, Exchange ex, int code, bytes name, bytes value)
    cpdef hop_by_hop_header(self, Exchange ex, int code, bytes value)
    cpdef forwarding_header(self, Exchange ex, int code, bytes value)
    cpdef keys_header(self, Exchange ex, int code, bytes name, bytes value)
