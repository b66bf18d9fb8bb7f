# The compiled build's declarations for keeper.py (gateway/_compiled.py): each client connection's deadlines as
# an extension type. Made and armed once per connection, and told of every call's start and end: interpreted,
# it was half of the front's CPU per connection under a flood of idle ones (issue 28).
cdef class Keeper:
    cdef public object conn, timing, on_close, _loop, _handle, _sent, _idle_since, _last_ping
    cdef public double _at, _start, _spread
    cdef public bint _handshaken, _acked, _aging
    cdef public Py_ssize_t _strikes
    # what a connection calls (FrameReader.keeper is typed): C calls; NoKeeper overrides each
    cpdef handshaken(self)
    cpdef settings_sent(self)
    cpdef settings_acked(self)
    cpdef call_started(self)
    cpdef calls_ended(self)
    cpdef bint ping(self)
    cpdef stop(self)

# Cython has a subclass declare again each cpdef method it overrides (else a C call would run Keeper's)
cdef class NoKeeper(Keeper):
    cpdef handshaken(self)
    cpdef settings_sent(self)
    cpdef settings_acked(self)
    cpdef call_started(self)
    cpdef calls_ended(self)
    cpdef bint ping(self)
    cpdef stop(self)
