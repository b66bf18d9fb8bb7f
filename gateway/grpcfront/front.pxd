# The compiled build's declarations for front.py (gateway/_compiled.py): each client connection's handler, and the
# front, as extension types. The front is one per process; its fields are C members (a call reads several of them,
# call.pxd types Call.front), and it keeps an instance dict so that tests can wrap its methods on the instance
# (its methods are plain ``def``: looked up by name, the wrapper is what runs).
from gateway.grpcfront.metrics cimport GrpcMetrics

cdef class _ServerSide:
    cdef public object front, client, connection, ident_key, ident, owned, owned_by
    cdef public dict heads

cdef class GrpcFront:
    cdef dict __dict__
    cdef public object router, tracer, settings, admission, authenticator, limits
    cdef public GrpcMetrics metrics
    cdef public object access, timing, gate, channels
    cdef public set calls
    cdef public dict sandbox_heads
    cdef public set connections
    cdef public object address, _server
    cdef public bint _draining
    cdef public object _idle, _ids
    cdef public list unaccounted
    cdef public object _account_timer, _id_prefix
