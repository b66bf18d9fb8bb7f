# The compiled build's declarations for frames.py (gateway/_compiled.py): the frame writers' sizes as C integers.
cimport cython

cdef bytearray _HEAD

@cython.locals(size=Py_ssize_t, head=bytearray)
cpdef bytes frame(int kind, int flags, Py_ssize_t stream_id, object payload=*)
cpdef bytes window_update(Py_ssize_t stream_id, Py_ssize_t increment)
cpdef bytes rst_stream(Py_ssize_t stream_id, Py_ssize_t code)
cpdef Py_ssize_t u32(bytes payload)
cpdef bytes header_frames(Py_ssize_t stream_id, bytes block, bint end_stream, Py_ssize_t max_size)
cpdef bytes unpad(int flags, bytes payload, Py_ssize_t stream_id)
