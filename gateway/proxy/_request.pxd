# The compiled build's declarations for _request.py (gateway/_compiled.py).
cimport cython
from gateway.proxy._exchange cimport Exchange
from gateway.proxy._keys cimport KeyedRequests

# on_header's table and header codes, typed: its lookup is a C dict get and its tests C comparisons.
cdef dict REQUEST_HEADERS_EXACT
cdef int R_AUTH, R_BOT, R_CL, R_CONNECTION, R_DROP, R_EXPECT, R_HOST, R_REQUEST_ID, R_TE, R_UPGRADE, R_XFF
# The states, body kinds, modes and pause bits it imports, as C ints: its tests of them are C comparisons.
cdef int CHUNKED, CODED, DONE, LENGTH, M_CLOSING, M_DISCARD, M_IN_HEAD, M_TUNNEL, M_UPGRADED, PAUSE_PIPELINE
cdef int PAUSE_SLOW_HEAD, PAUSE_WAIT

cdef class RequestReader(KeyedRequests):
    cpdef begin(self, Exchange ex, bint batch=*)
    @cython.locals(code=int)
    cpdef on_header(self, bytes name, bytes value)
    # on_header's kinds of header: C calls in the compiled build (one per header that is not forwarded as is)
    cpdef credential_header(self, Exchange ex, int code, bytes value)
    cpdef framing_header(self, Exchange ex, int code, bytes name, bytes value)
    cpdef hop_by_hop_header(self, Exchange ex, int code, bytes value)
    cpdef forwarding_header(self, Exchange ex, int code, bytes value)
    cpdef keys_header(self, Exchange ex, int code, bytes name, bytes value)
    cpdef on_message_begin(self)
    cpdef on_message_complete(self)
    cpdef head_read(self, Exchange ex)
    @cython.locals(last=Exchange, ex=Exchange, parts=list, i=Py_ssize_t)
    cpdef bint read_plain(self, bytes data)
