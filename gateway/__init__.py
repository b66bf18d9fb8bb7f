"""The async service: data plane, control API, sessions, stores and providers."""

# Before any submodule: whether the compiled hot path is used (see gateway._compiled).
from gateway import _compiled

_compiled.choose()
