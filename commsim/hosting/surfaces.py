"""The registry of hosted surfaces: each module surface is declared once, here.

`register_surface(name, install, uninstall)`; `install_all()` installs every registered
surface once per interpreter (idempotent); `uninstall_all()` restores the real modules.
(Minimal version of the hosting core's registry; see /work/coord/HOSTING-INTERFACE.md.)
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Callable

_lock = threading.RLock()


@dataclass
class Surface:
    name: str
    install: Callable[[], None]
    uninstall: Callable[[], None]
    installed: bool = False


_SURFACES: dict[str, Surface] = {}

# The module surfaces over the rank's driver; importing one registers it.
MODULE_SURFACES = ("commsim.hosting.cuda_bindings", "commsim.hosting.cudart",
                   "commsim.hosting.nvml", "commsim.hosting.torch_cuda")


def register_surface(name: str, install: Callable[[], None], uninstall: Callable[[], None]) -> None:
    with _lock:
        if name in _SURFACES:
            raise ValueError(f"surface {name!r} is registered twice")
        _SURFACES[name] = Surface(name, install, uninstall)


def _load() -> None:
    for mod in MODULE_SURFACES:
        importlib.import_module(mod)


def install(name: str) -> None:
    _load()
    with _lock:
        s = _SURFACES[name]
        if not s.installed:
            s.install()
            s.installed = True


def install_all() -> None:
    _load()
    for name in list(_SURFACES):
        install(name)


def uninstall_all() -> None:
    with _lock:
        for s in reversed(list(_SURFACES.values())):
            if s.installed:
                s.uninstall()
                s.installed = False


def installed(name: str) -> bool:
    return _SURFACES.get(name) is not None and _SURFACES[name].installed
