# The compiled build's declarations for _wire.py (gateway/_compiled.py): plain_head's scan as C indexing.
cimport cython

ctypedef const unsigned char *chars

@cython.locals(s=chars, n=Py_ssize_t, cut=Py_ssize_t, resume=Py_ssize_t, line=Py_ssize_t, colon=Py_ssize_t,
               end=Py_ssize_t, verdict=int)
cpdef object plain_head(bytes raw, Py_ssize_t pos, bytes request_id)

@cython.locals(c=int)
cdef Py_ssize_t _name_end(chars s, Py_ssize_t n, Py_ssize_t i)

@cython.locals(c=int)
cdef Py_ssize_t _line_end(chars s, Py_ssize_t n, Py_ssize_t i)

@cython.locals(size=Py_ssize_t, i=Py_ssize_t, word=bytes)
cdef int _plain_line(chars s, Py_ssize_t n, Py_ssize_t start, Py_ssize_t colon, Py_ssize_t end)

@cython.locals(size=Py_ssize_t)
cdef int _connection_option(chars s, Py_ssize_t n, Py_ssize_t value, Py_ssize_t end)

@cython.locals(size=Py_ssize_t, k=Py_ssize_t, c=int, w=chars)
cdef bint _is(chars s, Py_ssize_t n, Py_ssize_t at, bytes word, bint fold)

cdef int _T_URL, _T_NAME, _T_VALUE, _R_PLAIN, _R_LENGTH, _R_KEEP_ALIVE, _R_OTHER
cdef bytes _BYTE_CLASS

@cython.locals(s=chars, n=Py_ssize_t, size=Py_ssize_t, i=Py_ssize_t, line=Py_ssize_t, colon=Py_ssize_t,
               value=Py_ssize_t, end=Py_ssize_t, parts=list, method=bytes, table=chars)
cpdef list plain_request(bytes data)

@cython.locals(s=chars, n=Py_ssize_t, line=Py_ssize_t, colon=Py_ssize_t, value=Py_ssize_t, end=Py_ssize_t,
               kind=int, length=Py_ssize_t, cut=Py_ssize_t, resume=Py_ssize_t)
cpdef tuple plain_response(bytes data, bytes request_id)

@cython.locals(size=Py_ssize_t)
cdef int _response_line(chars s, Py_ssize_t n, Py_ssize_t line, Py_ssize_t colon, Py_ssize_t value, Py_ssize_t end)

@cython.locals(i=Py_ssize_t, table=chars)
cdef Py_ssize_t _status_end(chars s, Py_ssize_t n)

cdef tuple _NAME_SLOTS

cdef inline Py_ssize_t _name_slot(Py_ssize_t size, int first, int middle, int last)

@cython.locals(size=Py_ssize_t, word=bytes)
cdef bytes _header_name(chars s, Py_ssize_t n, Py_ssize_t line, Py_ssize_t colon)

@cython.locals(word=bytes)
cdef object _plain_method(chars s, Py_ssize_t n)

@cython.locals(i=Py_ssize_t, table=chars)
cdef Py_ssize_t _colon(chars s, Py_ssize_t line)

@cython.locals(i=Py_ssize_t)
cdef Py_ssize_t _value(chars s, Py_ssize_t colon)

@cython.locals(end=Py_ssize_t, table=chars)
cdef Py_ssize_t _value_end(chars s, Py_ssize_t value)

@cython.locals(number=Py_ssize_t, k=Py_ssize_t)
cdef Py_ssize_t _digits(chars s, Py_ssize_t value, Py_ssize_t end)

@cython.locals(word=bytes)
cdef bint _framing_name(chars s, Py_ssize_t n, Py_ssize_t start, Py_ssize_t size)

cdef class RequestIds:
    cdef public str prefix
    cdef public unsigned long long count
    cpdef bytes next(self)
