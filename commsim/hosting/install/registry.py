"""The registry of hosting surfaces: what a hosted program sees in place of the real modules.

A surface is declared once, in its own module: `register_surface(name, install, uninstall)`.
`install_all(modules)` imports the surface modules the caller names (the launcher passes the
surface table's, commsim/hosting/surfaces/table.py: this layer imports no surface) and
installs each registered surface once per interpreter. A surface that patches a heavy module (torch) waits for it to be imported:
`when_imported("torch.distributed", fn)` runs fn(module) right after the import (or at once,
when the module is already loaded), so hosting costs nothing for a program that never loads it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["register_surface", "install_all", "uninstall_all", "installed", "surfaces",
           "when_imported", "not_simulated", "wrap_torch_distributed"]

@dataclass
class Surface:
    name: str
    install: Callable[[], None]
    uninstall: Callable[[], None] | None
    installed: bool = False


_lock = threading.RLock()
_surfaces: dict[str, Surface] = {}


def register_surface(name: str, install: Callable[[], None],
                     uninstall: Callable[[], None] | None = None) -> None:
    """Declare a surface. Registering a name again replaces the declaration (not installed
    twice: an installed surface keeps running until uninstall_all)."""
    with _lock:
        old = _surfaces.get(name)
        s = Surface(name, install, uninstall)
        if old is not None and old.installed:
            s.installed = True
        _surfaces[name] = s


def surfaces(modules: Sequence[str] = ()) -> tuple[str, ...]:
    """The registered surfaces, after importing `modules`."""
    _load_modules(modules)
    return tuple(_surfaces)


def installed() -> tuple[str, ...]:
    return tuple(n for n, s in _surfaces.items() if s.installed)


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


def uninstall_all() -> None:
    with _lock:
        for s in reversed(list(_surfaces.values())):
            if s.installed and s.uninstall is not None:
                s.uninstall()
                s.installed = False


def not_simulated(surface: str) -> Callable[..., Any]:
    """A stand-in for an API commsim does not simulate: calling it fails loudly, naming it."""
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"commsim hosting: {surface} is not simulated")
    call.__name__ = surface.rsplit(".", 1)[-1]
    call.__qualname__ = call.__name__
    return call


# ---- post-import hooks ---------------------------------------------------------------------

_hooks: dict[str, list[Callable[[Any], None]]] = {}


class _HookLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        for fn in _hooks.get(module.__name__, ()):
            fn(module)


class _HookFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the finders after it and wraps the
    loader, so the hook runs once the module has executed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookLoader(spec.loader)
                return spec
        return None


_finder = _HookFinder()


def when_imported(name: str, fn: Callable[[Any], None]) -> None:
    """Run fn(module) once `name` is imported (now, if it already is)."""
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        _hooks.setdefault(name, []).append(fn)
    mod = sys.modules.get(name)
    if mod is not None:
        fn(mod)


# ---- wrapped torch.distributed functions -----------------------------------------------------

def wrap_torch_distributed(surface: str, marker: str,
                           wrappers: dict[str, Callable[[Any], Any]]) -> None:
    """Declare a surface that replaces functions of torch.distributed (and of its c10d module,
    which callers also reach directly) with `wrappers[name](real)`, once torch.distributed is
    imported, and puts the real ones back at uninstall. Each wrapper is marked with `marker`
    (one per surface), so a module patched twice is wrapped once, while two surfaces may
    wrap the same function in turn (inproc's dispatcher inside procs' gloo substitution)."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(dist: Any) -> None:
        import torch.distributed.distributed_c10d as c10d
        # One wrapper per real function, whichever module it is reached through: torch
        # compares them by identity (P2POp checks `op in [isend, irecv]` against c10d's own,
        # so `P2POp(dist.isend, ...)` must pass c10d.isend itself).
        made: dict[int, Any] = {}
        for mod in (dist, c10d):
            for name, wrap in wrappers.items():
                real = getattr(mod, name, None)
                if real is None or getattr(real, marker, False):
                    continue
                saved.append((mod, name, real))
                wrapper = made.get(id(real))
                if wrapper is None:
                    wrapper = made[id(real)] = wrap(real)
                    setattr(wrapper, marker, True)
                setattr(mod, name, wrapper)
        # torch's own submodules loaded with torch.distributed took some of these by
        # `from ...distributed_c10d import X` before this patch ran (device_mesh's
        # is_initialized: an inproc rank's init_device_mesh then called the real
        # init_process_group and blocked in its TCPStore rendezvous). Their names for a
        # real function get its wrapper too.
        for modname, mod in list(sys.modules.items()):
            if mod is None or mod is dist or mod is c10d or not modname.startswith("torch.distributed"):
                continue
            for name, value in list(vars(mod).items()):
                # `made` is keyed by the ids of real functions `saved` keeps alive: an equal
                # id is the same function.
                wrapper = made.get(id(value))
                if wrapper is not None:
                    saved.append((mod, name, value))
                    setattr(mod, name, wrapper)

    def restore() -> None:
        while saved:
            mod, name, real = saved.pop()
            setattr(mod, name, real)

    register_surface(surface, lambda: when_imported("torch.distributed", patch), restore)
