"""Session stores: where bindings and sandbox records live."""

from gateway.store.base import Caps, Invalidation, Reservation, SessionStore, Settlement

__all__ = ["Caps", "Invalidation", "Reservation", "SessionStore", "Settlement"]
