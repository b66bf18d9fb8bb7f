# The compiled build's declarations for _wire.py (gateway/_compiled.py): plain_head's scan as C indexing.
cimport cython

ctypedef const unsigned char *chars

@cython.locals(s=chars, n=Py_ssize_t, cut=Py_ssize_t, resume=Py_ssize_t, line=Py_ssize_t, i=Py_ssize_t,
               colon=Py_ssize_t, c=int, verdict=int)
cpdef object plain_head(bytes raw, Py_ssize_t pos)

@cython.locals(size=Py_ssize_t, value=Py_ssize_t, last=Py_ssize_t, i=Py_ssize_t)
cdef int _plain_line(chars s, Py_ssize_t n, Py_ssize_t start, Py_ssize_t colon, Py_ssize_t end)

@cython.locals(size=Py_ssize_t, k=Py_ssize_t, c=int, w=chars)
cdef bint _is(chars s, Py_ssize_t n, Py_ssize_t at, bytes word, bint fold)
