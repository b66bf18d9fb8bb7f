"""The async service: data plane, control API, sessions, stores and providers."""
