# The compiled build's declarations for route_cache.py (gateway/_compiled.py): the hit path, once per request.
cdef class RouteLookup:
    cdef public dict by_session
    cdef public object clock, events, activity, refusal
    cpdef object route(self, object identity, object owned=*)
