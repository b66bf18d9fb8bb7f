# The compiled build's declarations for host.py (gateway/_compiled.py): what a call reads of its front, as C struct
# members (GrpcFront extends it, front.pxd; Call.front is typed by it, call.pxd).
from gateway.proxy._admission cimport Admission

cdef class CallHost:
    cdef public object router, tracer
    cdef public Admission admission
    cdef public object channels
    cdef public set calls
    cdef public dict sandbox_heads, targets
    cdef public list unaccounted
