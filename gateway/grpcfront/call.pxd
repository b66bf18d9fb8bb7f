# The compiled build's declarations for call.py (gateway/_compiled.py): the fields as C struct members.
from gateway.grpcfront.connection cimport Connection
from gateway.grpcfront.head cimport forwardable, http_status, sandbox_head, status_of
from gateway.grpcfront.host cimport CallHost
from gateway.grpcfront.stream cimport Endpoint, Stream, relay_now

cdef class Call:
    cdef public CallHost front
    cdef public object conn
    cdef public Stream down
    cdef public object headers, task
    cdef public Stream up
    cdef public object pump, side
    cdef public bint sandbox_reset, head_sent, done
    cdef public int status
    cdef public object path
    cdef public double t0
    cdef public object route, deadline, stream_key, to_sandbox, to_client, org_id, refused
    cdef public bint running
    cdef public object identity, request
    cdef public bint resent
    cdef public object error, code
    cdef public double sent_at
    cdef public object upstream, timeout, trace
    cdef public bint fast
    cdef public object timer, target, sandbox_head

    # the methods a call served by callbacks runs, as C calls between them
    cpdef _start(self)
    cpdef object _admit(self)
    cpdef _routed(self, object route)
    cpdef _send_head(self, Connection connection, object out)
    cpdef _open_up(self, Connection connection, object head)
    cpdef bint _request_fits(self, Stream up)
    cpdef _send_request_now(self, Stream up)
    cpdef object _answer_now(self, object response, object sandbox_id)
    cpdef object _send_trailers(self, object sandbox_id)
    cpdef _settled(self, object status)
    cpdef _finish(self)
    cpdef _leave_callbacks(self)
    cpdef _cleanup(self)
    cpdef reset_up(self)
    cpdef bint _sandbox_answered(self)
    cpdef bint _hold_alone(self, Endpoint conn)

cdef class _Side:
    cdef public Call call
    cdef public object name
