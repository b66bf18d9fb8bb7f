"""Session stores: where bindings and sandbox records live."""

from gateway.store.base import (
    Caps, CapScope, Invalidation, LeaseLost, NotReserved, Reservation, Reserved, SessionStore, Settled, Settlement,
    SettleTimeout, StoreSignal,
)

__all__ = ["CapScope", "Caps", "Invalidation", "LeaseLost", "NotReserved", "Reservation", "Reserved", "SessionStore",
           "SettleTimeout", "Settled", "Settlement", "StoreSignal"]
