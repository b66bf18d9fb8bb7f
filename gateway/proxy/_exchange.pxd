# The compiled build's declarations for _exchange.py (gateway/_compiled.py): the fields as C struct members.
cimport cython
cdef class Exchange:
    cdef public object client
    cdef public bytes url, method
    cdef public list headers
    cdef public long long hsize
    cdef public object org, user, session, bot, auth, host, xff, request_id, tokens
    cdef public int body
    cdef public bint expect
    cdef public object upgrade
    cdef public bint websocket, version10, keep_alive, conn_ka, req_done
    cdef public object pending, early, reject, identity, route, upstream, task
    cdef public int state, status
    cdef public bint started, close_after
    cdef public long long bytes_in, bytes_out
    cdef public double t0, active_at
    cdef public bint stream
    cdef public object protocol, error
    cdef public bint retried
    cdef public object stream_key, refused, compat
    cdef public double timeout, deadline
    cdef public object keyed, cookie_tokens, code
    cdef public double sent_at
    cdef public object upstream_time, trailers, trace

cdef class RequestLog:
    cdef public object method, pool, sandbox_id
    cdef public int status
    cdef public double duration
    cdef public long long bytes_in, bytes_out
    cdef public object protocol, request_id, error, org_id, refused, target, session_id, upstream, code, trace_id

@cython.locals(request_id=bytes, record=RequestLog)
cpdef RequestLog request_log(Exchange ex, double duration)
