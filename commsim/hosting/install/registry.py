"""The registry of hosting surfaces: what a hosted program sees in place of the real modules.

A surface is declared once, in its own module: `register_surface(name, patch)`, where
`patch(patches)` makes every change through the surface's one recorder (`patches.Patches`:
attributes of foreign modules, `sys.modules` entries, post-import hooks, served libraries).
`install_all(modules)` imports the surface modules the caller names (the launcher passes the
surface table's, commsim/hosting/surfaces/table.py: this layer imports no surface) and installs
each registered surface once per interpreter; a surface's install/uninstall nest (the
bootstrap's and a test's), the outermost pair patching and restoring. A surface over a heavy module (torch) patches it from
`patches.on_import(...)`, so hosting costs nothing for a program that never loads it.
"""

from __future__ import annotations

import importlib
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from commsim.hosting.install.dispatch import not_simulated
from commsim.hosting.install.patches import Patches

__all__ = ["register_surface", "install_all", "uninstall_all", "installed", "surfaces",
           "replaced_modules",
           "not_simulated", "wrap_torch_distributed", "Surface"]

@dataclass(eq=False)
class Surface:
    """A declared surface: `patch(patches)` installs it; install/uninstall nest."""

    name: str
    patch: Callable[[Patches], None]
    patches: Patches = field(default_factory=Patches)
    installed: bool = False           # by install_all
    _depth: int = 0
    _lock: Any = field(default_factory=threading.Lock)

    def install(self) -> None:
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self.patch(self.patches)

    def reapply(self) -> None:
        """Patch again after something outside hosting put sys.modules or sys.meta_path back
        behind this surface (its flags still say installed): undo what is left of its patches
        and make them all again, at the same nesting depth."""
        with self._lock:
            if self._depth > 0:
                self.patches.restore()
                self.patch(self.patches)

    def uninstall(self) -> None:
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self.patches.restore()


_lock = threading.RLock()
_surfaces: dict[str, Surface] = {}


def register_surface(name: str, patch: Callable[[Patches], None]) -> Surface:
    """Declare a surface. Registering a name again replaces the declaration (not installed
    twice: an installed surface keeps running, and the new declaration takes over its
    recorder and nesting depth, so uninstall_all restores what the first one patched)."""
    with _lock:
        old = _surfaces.get(name)
        s = Surface(name, patch)
        if old is not None and old.installed:
            with old._lock:
                s.installed, s.patches, s._depth = True, old.patches, old._depth
        _surfaces[name] = s
        return s


def surfaces(modules: Sequence[str] = ()) -> tuple[str, ...]:
    """The registered surfaces, after importing `modules`."""
    _load_modules(modules)
    return tuple(_surfaces)


def installed() -> tuple[str, ...]:
    return tuple(n for n, s in _surfaces.items() if s.installed)


def replaced_modules() -> dict[str, Any]:
    """The real modules the installed surfaces took out of sys.modules (name -> module)."""
    with _lock:
        out: dict[str, Any] = {}
        for s in _surfaces.values():
            if s.installed:
                out.update(s.patches.replaced())
        return out


def _load_modules(modules: Sequence[str]) -> None:
    for mod in modules:
        if mod not in sys.modules:
            importlib.import_module(mod)


def install_all(modules: Sequence[str] = ()) -> None:
    """Import `modules` (each registers its surfaces) and install every registered surface
    once per interpreter (idempotent)."""
    with _lock:
        _load_modules(modules)
        for s in list(_surfaces.values()):
            if not s.installed:
                s.install()
                s.installed = True
            elif s.patches.lost():
                s.reapply()


def uninstall_all() -> None:
    with _lock:
        for s in reversed(list(_surfaces.values())):
            if s.installed:
                s.uninstall()
                s.installed = False


# ---- wrapped torch.distributed functions -----------------------------------------------------

def wrap_torch_distributed(surface: str, wrappers: dict[str, Callable[[Any], Any]]) -> Surface:
    """Declare a surface that replaces functions of torch.distributed (and of its c10d module,
    which callers also reach directly) with `wrappers[name](real)`, once torch.distributed is
    imported, and puts the real ones back at uninstall. Two surfaces may wrap the same
    function in turn (inproc's dispatcher inside procs' gloo substitution)."""

    def patch(patches: Patches) -> None:
        patches.on_import("torch.distributed", lambda dist: _wrap(patches, dist, wrappers))

    return register_surface(surface, patch)


def _wrap(patches: Patches, dist: Any, wrappers: dict[str, Callable[[Any], Any]]) -> None:
    import torch.distributed.distributed_c10d as c10d     # loaded with torch.distributed
    # One wrapper per real function, whichever module it is reached through: torch
    # compares them by identity (P2POp checks `op in [isend, irecv]` against c10d's own,
    # so `P2POp(dist.isend, ...)` must pass c10d.isend itself).
    made: dict[int, Any] = {}      # keyed by the ids of real functions the wrappers keep alive
    for mod in (dist, c10d):
        for name, wrap in wrappers.items():
            real = getattr(mod, name, None)
            if real is None or patches.holds(mod, name):
                continue
            wrapper = made.get(id(real))
            if wrapper is None:
                wrapper = made[id(real)] = wrap(real)
            patches.attr(mod, name, wrapper)
    # torch's own submodules loaded with torch.distributed took some of these by
    # `from ...distributed_c10d import X` before this patch ran (device_mesh's
    # is_initialized: an inproc rank's init_device_mesh then called the real
    # init_process_group and blocked in its TCPStore rendezvous). Their names for a
    # real function get its wrapper too.
    # Only the names of sys.modules are walked: in a rank forked from the zygote each object
    # touched is a copy-on-write fault (the whole table's modules were 8 ms a rank).
    for modname in [n for n in sys.modules if n.startswith("torch.distributed")]:
        mod = sys.modules.get(modname)
        if mod is None or mod is dist or mod is c10d:
            continue
        for name, value in list(vars(mod).items()):
            wrapper = made.get(id(value))
            if wrapper is not None:
                patches.attr(mod, name, wrapper)
