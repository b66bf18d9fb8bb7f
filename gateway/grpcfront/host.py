"""What a call reads of its front: ``GrpcFront``'s base, in a module of its own so that the compiled build types
``Call.front`` (call.pxd cimports host.pxd) and a call reads these as C members. call.pxd cannot name ``GrpcFront``
itself: front.py imports call.py, and the cimport would make that a cycle at run time. The front's methods a call
uses (``account``, ``finished``, ``target``) are looked up by name, as tests wrap them on the instance."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.grpcfront.call import Call
    from gateway.proxy._admission import Admission


class CallHost:
    """The front's fields a call reads (set by ``GrpcFront.__init__``)."""

    router: Any
    tracer: Any
    admission: Admission
    channels: Any
    calls: set[Call]
    sandbox_heads: dict[Any, Any]
    targets: dict[int, Any]
    unaccounted: list[Any]
