# The compiled build's declarations for _admission.py (gateway/_compiled.py): Admission's fields as C struct
# members, so that the data plane asks it who a request is from with a C call (once per request).

cdef class Admission:
    cdef public object authenticator, limits, cached_route
    cdef public bint memoizable, limited, caps_streams
    cpdef object identify(self, object memo, object credentials)
