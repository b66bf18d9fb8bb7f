# The compiled build's declarations for head.py (gateway/_compiled.py): what a call reads of every answer, as C
# functions call.pxd cimports.
cpdef object status_of(object headers)
cpdef bytes http_status(object headers)
cpdef object forwardable(object headers, bint head)
