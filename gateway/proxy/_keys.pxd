# The compiled build's declarations for _keys.py (gateway/_compiled.py).
from gateway.proxy._refusals cimport Refusals

cdef class KeyedRequests(Refusals):
    pass
