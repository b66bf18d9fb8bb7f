"""Sandbox providers: local processes, a static fleet, Kubernetes agent-sandbox CRs."""

from gateway.providers.base import LostHandler, PoolProviders, SandboxProvider

__all__ = ["LostHandler", "PoolProviders", "SandboxProvider"]
