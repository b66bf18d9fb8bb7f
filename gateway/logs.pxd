# The compiled build's declarations for logs.py (gateway/_compiled.py).
cimport cython
from gateway.proxy._exchange cimport RequestLog

cdef tuple _CENTS  # the fractions of a figure in milliseconds

cdef class AccessLog:
    cdef public object _stream
    cdef public bint _json, keep_query
    cdef public list _pending
    cdef public Py_ssize_t _max_pending
    cdef public dict _quoted, _whos, _whats
    cdef public long long _second, _milli
    cdef public str _stamp, _ts
    @cython.locals(now=double, milli=cython.longlong, second=cython.longlong, took=cython.longlong)
    cpdef log(self, RequestLog entry)
    cpdef flush(self)
    @cython.locals(kept=tuple)
    cdef str _who(self, RequestLog entry)
    @cython.locals(kept=tuple, status=int)
    cdef str _what(self, RequestLog entry)

@cython.locals(hundredths=cython.longlong)
cdef str _ms(double seconds)

cdef long long _hundredths(double seconds)

cdef inline bint _same(object a, object b)
