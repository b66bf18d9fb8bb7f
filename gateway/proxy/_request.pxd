# The compiled build's declarations for _request.py (gateway/_compiled.py).
from gateway.proxy._keys cimport KeyedRequests

cdef class RequestReader(KeyedRequests):
    pass
