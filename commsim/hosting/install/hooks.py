"""Post-import hooks: run a function on a module right after the program imports it.

A surface that patches a heavy module (torch) waits for it: hosting costs nothing for a
program that never loads it. The finder finds nothing itself; for a watched name it asks the
finders after it and wraps the loader, so the hook runs once the module has executed."""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Any, Callable

__all__ = ["when_imported", "forget"]

_lock = threading.RLock()
_hooks: dict[str, list[Callable[[Any], None]]] = {}


class _HookLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        for fn in list(_hooks.get(module.__name__, ())):
            fn(module)


class _HookFinder(importlib.abc.MetaPathFinder):
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


def forget(name: str, fn: Callable[[Any], None]) -> None:
    """Stop running fn on later imports of `name`."""
    with _lock:
        fns = _hooks.get(name)
        if fns is not None and fn in fns:
            fns.remove(fn)
            if not fns:
                del _hooks[name]
