# The compiled build's declarations for route_cache.py (gateway/_compiled.py): the hit path, once per request.
cimport cython

cdef class CachedRoute:
    cdef public object route
    cdef public double fresh_until, stale_until

cdef class RouteLookup:
    cdef public dict by_session
    cdef public object clock, events, counted, activity, refusal
    @cython.locals(cached=CachedRoute)
    cpdef object route(self, object identity, object owned=*)
    cpdef stream_opened(self, object sandbox_id)
    cpdef stream_closed(self, object sandbox_id)
