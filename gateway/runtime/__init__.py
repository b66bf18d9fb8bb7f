"""Reference sandbox runtime (agent-sandbox python-runtime API) for the local provider and tests."""

from .server import create_app, run

__all__ = ["create_app", "run"]
