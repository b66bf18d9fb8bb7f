# The compiled build's declarations for relay.py (gateway/_compiled.py): the fields as C struct members.
cimport cython

cdef class RelayBuffer:
    cdef public object _ack
    cdef public Py_ssize_t _stream_id
    cdef public object _chunks
    cdef public Py_ssize_t size
    cdef public bint _ended
    cdef public object _waiter, _loop
    cpdef add(self, object data, Py_ssize_t ack_size)
    cpdef eof(self)
    cdef _wake(self)
    cpdef bytes take_now(self)
    cpdef bytes peek(self)

@cython.locals(size=Py_ssize_t, count=Py_ssize_t, pos=Py_ssize_t, need=Py_ssize_t, end=Py_ssize_t)
cpdef tuple scan(bytes data, Py_ssize_t left, bytes prefix)
