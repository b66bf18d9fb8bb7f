# The compiled build's declarations for _upstream.py (gateway/_compiled.py).
cimport cython
from gateway.proxy._exchange cimport Exchange
from gateway.proxy._state cimport PlaneState

# The states, body kinds and framings it imports, as C ints: its tests of them are C comparisons.
cdef int BODY, NO_BODY, F_DECHUNK, F_NONE, F_PASS, F_RAW, F_RECHUNK, TUNNEL, WAITING
cdef int CODING_CHUNKED, CODING_NONE
cdef bint COMPILED

cdef class UpstreamPool:
    cdef public PlaneState plane
    cdef public object host, port
    cdef public bytes host_line
    cdef public list idle
    cdef public Py_ssize_t size
    @cython.locals(idle=list, conn=UpstreamConnection)
    cpdef UpstreamConnection take(self)
    cpdef release(self, UpstreamConnection conn)

cdef class UpstreamConnection:
    cdef public PlaneState plane
    cdef public UpstreamPool pool
    cdef public object transport, parser
    cdef public Exchange ex
    cdef public object client_tr
    cdef public bint reused, closed, broken
    cdef public double idle_since
    cdef public bint rpaused, wpaused, done, keep, interim, extra, tunneled
    cdef public object raw
    cdef public Py_ssize_t raw_pos
    cdef public bytes head_out
    cdef public int framing
    cdef public object dechunker, frames, sse_end
    cpdef pause_for_client(self)
    cpdef resume_for_client(self)
    cpdef _detach(self, Exchange ex)
    cpdef abort(self)
    cpdef _body(self, Exchange ex, object data, object head)
    cpdef bint _not_final(self, Exchange ex, int status)
    cpdef bint _passes_through(self, Exchange ex, int status)
    @cython.locals(raw=bytes)
    cpdef object _head_so_far(self, Exchange ex, bytes data)
    @cython.locals(plain=tuple, out=bytes, body=Py_ssize_t)
    cpdef bint read_plain(self, Exchange ex, bytes data)
    cpdef _complete(self, Exchange ex)
