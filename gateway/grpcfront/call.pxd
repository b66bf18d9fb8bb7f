# The compiled build's declarations for call.py (gateway/_compiled.py): the fields as C struct members.
from gateway.grpcfront.stream cimport Stream

cdef class Call:
    cdef public object front, conn
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

cdef class _Side:
    cdef public Call call
    cdef public object name
