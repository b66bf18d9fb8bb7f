# The compiled build's declarations for _refusals.py (gateway/_compiled.py).
from gateway.proxy._state cimport ClientState

cdef class Refusals(ClientState):
    pass
