# The compiled build's declarations for _downstream.py (gateway/_compiled.py).
from gateway.proxy._exchange cimport Exchange
from gateway.proxy._request cimport RequestReader
from gateway.proxy._upstream cimport UpstreamConnection, UpstreamPool

cdef class DownstreamConnection(RequestReader):
    pass
