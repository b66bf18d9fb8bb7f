# The compiled build's declarations for _downstream.py (gateway/_compiled.py).
cimport cython
from gateway.proxy._admission cimport Admission
from gateway.proxy._exchange cimport Exchange
from gateway.proxy._request cimport RequestReader
from gateway.proxy._upstream cimport UpstreamConnection, UpstreamPool

# The states, body kinds, modes and pause bits it imports, as C ints: its tests of them are C comparisons.
cdef int CHUNKED, DONE, NO_BODY, PARSED, RESOLVING, TUNNEL, WAITING, M_CLOSING, M_DISCARD, M_EOF, M_IN_HEAD
cdef int M_LINGER, M_TUNNEL, M_UPGRADED, PAUSE_PIPELINE, PAUSE_SLOW_HEAD, PAUSE_WAIT
cdef bint COMPILED

cdef class DownstreamConnection(RequestReader):
    cpdef refuse_connection(self, str bound)
    cpdef pause(self, int bit)
    cpdef resume(self, int bit)
    cpdef _flush_up(self)
    cpdef begin(self, Exchange ex, bint batch=*)
    cpdef bint _answered_early(self, Exchange ex, bint batch)
    @cython.locals(admission=Admission)  # identify() a C call
    cpdef object _admit(self, Exchange ex)
    @cython.locals(pool=UpstreamPool, conn=UpstreamConnection, admission=Admission)  # pool.take() a C call
    cpdef _carry(self, Exchange ex, object identity, bint batch)
    cpdef attach(self, Exchange ex, object route, UpstreamConnection conn, bint batch)
    cpdef _deadline(self, Exchange ex, object route)
    @cython.locals(parts=list, tail=bytes)
    cpdef bytes _request_head(self, Exchange ex, object route, UpstreamConnection conn)
    cpdef bytes _head_tail(self, bytes forwarded, object host)
    cpdef _body_so_far(self, Exchange ex, list out)
    cpdef fail(self, Exchange ex, object exc)
    cpdef _send(self, object data)
    cpdef finish(self, Exchange ex, bint close)
