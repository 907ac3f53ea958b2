"""Backends: ipc, fabric, multicast, symm, nccl, and any registered from
outside. A backend sees the driver protocol only (commsim/driver.py), never the simulator or
the device binding. `registry` holds the one list of them."""

from commsim.backends.registry import (ENTRY_POINT_GROUP, BackendDeclarationError, backend_names, backends,
                       default_order, fallbacks, get_backend, register_backend)

__all__ = ["ENTRY_POINT_GROUP", "BackendDeclarationError", "backend_names", "backends",
           "default_order", "fallbacks", "get_backend", "register_backend"]
