# The compiled build's declarations for upstream.py (gateway/_compiled.py): the fields as C struct members.
cdef class _ClientSide:
    cdef public object channels, target

cdef class UpstreamChannels:
    cdef public double _connect_timeout
    cdef public object on_failure
    cdef public dict _connections, _connecting
