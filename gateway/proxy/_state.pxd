# The compiled build's declarations for _state.py (gateway/_compiled.py): the fields as C struct members.
cimport cython
from gateway.proxy._exchange cimport Exchange, RequestLog, request_log
from gateway.proxy._wire cimport RequestIds

cdef int DONE  # imported from _exchange: a C comparison

cdef class RequestHooks:
    cdef public tuple hooks
    cpdef report(self, RequestLog record)

cdef class ClientState

cdef class PlaneState:
    cdef public double now
    cdef public bint draining, closed, trust_xff, keyed
    cdef public Py_ssize_t inflight, streams, max_head, body_cap, write_high
    cdef public object max_body, ws_max_message
    cdef public dict request_timeouts, pools
    cdef public set clients
    cdef public dict slow_heads
    cdef public object ready_heads
    cdef public object gate
    cdef public RequestIds ids
    cdef public object admission, loop, keys, compat, options, resolver, on_request, drained
    cdef public object hosts, tracer
    cdef public dict wheel
    cdef public double tick_len
    cdef public Py_ssize_t wheel_at, begin_tick
    cpdef watch(self, ClientState client, double when)
    cpdef enter(self, ClientState client, Py_ssize_t tick)
    cpdef stream_began(self, Exchange ex)
    @cython.locals(hooks=RequestHooks)
    cpdef finished(self, Exchange ex)

cdef class ClientState:
    cdef public bint big
    cdef public bytes conn_line
    cdef public Exchange current
    cdef public double head_at
    cdef public double head_timeout
    cdef public Py_ssize_t head_seen
    cdef public list head_raw
    cdef public object host_ok
    cdef public object cookie_scan
    cdef public object ident, ident_key
    cdef public double idle_since
    cdef public Exchange last
    cdef public double linger_until
    cdef public int mode
    cdef public object owned, owned_by
    cdef public object parser
    cdef public Exchange parsing
    cdef public bytes peer
    cdef public PlaneState plane
    cdef public object queue, route_key
    cdef public bytes route_line
    cdef public object route_pool, route_tail, tail_host
    cdef public int rpause
    cdef public object transport
    cdef public object up_conn
    cdef public list up_out
    cdef public Py_ssize_t watch_tick
    cdef public bint wpaused
    cdef public object ws_guard
