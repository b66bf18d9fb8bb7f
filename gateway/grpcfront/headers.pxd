# The compiled build's declarations for headers.py (gateway/_compiled.py): the fields as C struct members.
cdef class HeaderCodec:
    cdef public object _decoder, _encoder
    cdef public dict _decoded, _encoded, _checked, _by_id
    cpdef tuple decode(self, bytes block)
    cpdef tuple check_request(self, bytes block, tuple headers)
    cpdef bytes encode(self, object headers)
    cpdef _forget_encoded(self)
