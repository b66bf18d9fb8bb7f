# The compiled build's declarations for head.py (gateway/_compiled.py): what a call reads of every answer, and the
# request head it sends the sandbox, as C functions call.pxd cimports.
cpdef object status_of(object headers)
cpdef bytes http_status(object headers)
cpdef object forwardable(object headers, bint head)
cpdef tuple sandbox_head(dict heads, object out, str path, tuple target, str sandbox_id, object timeout, bint exact)
