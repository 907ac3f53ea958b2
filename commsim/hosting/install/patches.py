"""The patch recorder: every change hosting makes to a foreign module goes through one.

Modelled on pyfakefs's `Patcher`, which patches every place a faked module is reachable and
undoes them all from one list: a `Patches` records each attribute it replaces (on a module,
a class or any other foreign object), each `sys.modules` entry, each post-import hook and
each extra undo, and `restore()` puts them back in reverse order. A surface owns one
recorder; `registry.Surface` drives it, so nested install/uninstall pairs (the bootstrap's
and a test's) patch once and restore once."""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

from commsim.hosting.install import hooks

__all__ = ["Patches"]

_ABSENT = object()


class Patches:
    """One surface's patches, restorable in one call."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._undo: list[Callable[[], None]] = []
        self._held: set[tuple[int, str]] = set()
        self._replaced: dict[str, Any] = {}     # sys.modules name -> the module it held
        self._entries: dict[str, Any] = {}      # sys.modules name -> what this recorder put there
        self._finders: list[Any] = []

    def attr(self, target: Any, name: str, value: Any) -> Any:
        """Set `target.name = value`; restore() puts back what was there. Returns the value
        replaced (None where there was none), the real one to fall back on."""
        with self._lock:
            own = vars(target).get(name, _ABSENT) if hasattr(target, "__dict__") else _ABSENT
            before = getattr(target, name, None)
            setattr(target, name, value)
            self._held.add((id(target), name))
            self._undo.append(lambda: _put_back(target, name, own, before))
            return before

    def holds(self, target: Any, name: str) -> bool:
        """Whether this recorder has replaced `target.name` (and not yet restored it)."""
        return (id(target), name) in self._held

    def module(self, name: str, module: Any) -> Any:
        """Set `sys.modules[name] = module`; restore() puts back the entry (or its absence)."""
        with self._lock:
            before = sys.modules.get(name, _ABSENT)
            sys.modules[name] = module
            self._held.add((id(sys.modules), name))
            self._entries[name] = module
            if before is not _ABSENT and before is not None:
                self._replaced.setdefault(name, before)

            def undo() -> None:
                if before is _ABSENT:
                    if sys.modules.get(name) is module:
                        del sys.modules[name]
                else:
                    sys.modules[name] = before
            self._undo.append(undo)
            return None if before is _ABSENT else before

    def replaced(self) -> dict[str, Any]:
        """The modules this recorder's `module()` calls took out of sys.modules (name -> the
        real module), while they are out."""
        return dict(self._replaced)

    def switch(self, target: Any, name: str, value: Any) -> None:
        """Set an attribute this recorder holds to another value without recording it: a
        view switched often (the environ mapping an inproc rank sees, on every greenlet
        switch); restore() still puts back the original."""
        if (id(target), name) not in self._held:
            raise KeyError(f"switch({name!r}) of an attribute this recorder does not hold")
        setattr(target, name, value)

    def switch_module(self, name: str, module: Any) -> None:
        """`switch` for a sys.modules entry this recorder holds (a rank's __main__)."""
        if (id(sys.modules), name) not in self._held:
            raise KeyError(f"switch_module({name!r}) of an entry this recorder does not hold")
        sys.modules[name] = module
        self._entries[name] = module

    def finder(self, finder: Any, *, first: bool = False) -> None:
        """Put a meta-path finder on sys.meta_path (ahead of the others when `first`);
        restore() takes it off."""
        with self._lock:
            if first:
                sys.meta_path.insert(0, finder)
            else:
                sys.meta_path.append(finder)
            self._finders.append(finder)
            self._undo.append(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)

    def on_import(self, module_name: str, patch: Callable[[Any], None]) -> None:
        """Run patch(module) once the program imports `module_name` (now, if it has): a
        surface over a heavy module (torch) costs nothing to a program that never loads it.
        restore() stops the hook; patch's own changes go through this recorder too."""
        with self._lock:
            self._undo.append(lambda: hooks.forget(module_name, patch))
        hooks.when_imported(module_name, patch)

    def lost(self) -> list[str]:
        """The sys.modules entries and meta-path finders this recorder put in place that are
        no longer there: something outside hosting put sys.modules or sys.meta_path back
        (pytester's in-process run restores both from a snapshot)."""
        with self._lock:
            out = [name for name, mod in self._entries.items() if sys.modules.get(name) is not mod]
            return out + [f"finder {type(f).__name__}" for f in self._finders if f not in sys.meta_path]

    def on_restore(self, undo: Callable[[], None]) -> None:
        """Run `undo` at restore(), in reverse order with the other patches."""
        with self._lock:
            self._undo.append(undo)

    def restore(self) -> None:
        with self._lock:
            while self._undo:
                self._undo.pop()()
            self._held.clear()
            self._replaced.clear()
            self._entries.clear()
            self._finders.clear()


def _put_back(target: Any, name: str, own: Any, before: Any) -> None:
    if own is not _ABSENT:
        setattr(target, name, own)
        return
    try:
        delattr(target, name)          # it was inherited (a class attribute) or absent
    except (AttributeError, TypeError):
        setattr(target, name, before)  # not deletable (a module's __class__)


def forget_module(name: str, module: Any) -> None:
    """Drop `sys.modules[name]` when it is `module`, so the next import asks the meta-path
    finders again: in-process runs share one sys.modules, and a finder that serves a module
    to some runs only (mpi4py where it is installed) must be asked afresh by each."""
    if sys.modules.get(name) is module:
        del sys.modules[name]
