# The compiled build's declarations for front.py (gateway/_compiled.py): each client connection's handler as
# an extension type. GrpcFront stays a Python class (compiled methods): one per process, and tests wrap its
# methods on the instance.
cdef class _ServerSide:
    cdef public object front, client, connection, ident_key, ident
    cdef public dict heads
