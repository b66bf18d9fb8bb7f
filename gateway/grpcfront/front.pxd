# The compiled build's declarations for front.py (gateway/_compiled.py): each client connection's handler, and the
# front, as extension types. The front is one per process; its own methods read its fields as C members, and it
# keeps an instance dict so that tests can wrap its methods on the instance (what calls them looks them up by name,
# so the wrapper is what runs). Call.front is typed by the front's base, CallHost (host.pxd): call.pxd cimporting
# this module would make call.py's import of it a cycle at run time (front.py imports call.py).
from gateway.grpcfront.call cimport Call
from gateway.grpcfront.host cimport CallHost
from gateway.grpcfront.metrics cimport GrpcMetrics

cdef class _ServerSide:
    cdef public object front, client, connection, ident_key, ident, owned, owned_by
    cdef public dict heads

cdef class GrpcFront(CallHost):
    cdef dict __dict__
    cdef public object settings, authenticator, limits
    cdef public GrpcMetrics metrics
    cdef public object access, timing, gate
    cdef public set connections
    cdef public object address, _server
    cdef public bint _draining
    cdef public object _idle, _ids
    cdef public object _account_timer, _id_prefix
    # a call's start, a C call's reads of the call (the wrapper a test puts on the instance is what _ServerSide calls)
    cpdef begin(self, Call call)

# the access-log entry: the call's fields read as C members (sixteen attribute lookups a call otherwise)
cpdef object call_log(Call call, str request_id, double duration)
