"""The compiled-extension surface: a hosted rank that loads a compiled CUDA extension
declared in `extensions.py` gets the named error (or, once ops are served, the served module)
instead of an unnamed loader error, and no JIT build starts.

Two ways in:
- Python extension modules (`import vllm._C`): a finder ahead of the others takes the path
  finder's spec of the module and, in a hosted rank, gives it a loader that raises. So
  `importlib.util.find_spec` still answers as installed; only the load is refused.
- FlashInfer's JIT modules: once `flashinfer.jit.core` is imported, `JitSpec.build_and_load`
  and every spec class's `build` and `load` refuse in a hosted rank before anything runs
  (no ninja, nvcc or CuTe-DSL process; no AOT `.so` loaded). Outside a hosted rank both
  are the library's own.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Any

from commsim.hosting.install.nesting import nested
from commsim.hosting.install.registry import register_surface, when_imported
from commsim.hosting.state.session import hosted
from commsim.hosting.surfaces.compiled.extensions import EXTENSIONS, not_served_error

_IMPORTED = frozenset(e.module for e in EXTENSIONS if e.kind == "import")
_active = [False]
_lock = threading.Lock()


class _RefusingLoader(importlib.abc.Loader):
    def __init__(self, name: str) -> None:
        self.name = name

    def create_module(self, spec: Any) -> Any:
        raise not_served_error("import", self.name)

    def exec_module(self, module: Any) -> None:       # never reached: create_module raised
        raise not_served_error("import", self.name)


class _ExtensionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _IMPORTED or not _active[0] or hosted() is None:
            return None
        # Extension modules are files on the package's path: the path finder's spec, with a
        # loader that refuses.
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _RefusingLoader(name)
        return spec


_finder = _ExtensionFinder()
_patched: list[tuple[Any, str, Any]] = []


def _refusing(real: Any) -> Any:
    @functools.wraps(real)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _active[0] and hosted() is not None:
            raise not_served_error("flashinfer-jit", getattr(self, "name", type(self).__name__))
        return real(self, *args, **kwargs)
    call.__commsim_compiled__ = True                  # type: ignore[attr-defined]
    return call


def _spec_classes(base: type) -> list[type]:
    out, todo = [], [base]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return out


def _patch_jit(core: Any) -> None:
    with _lock:
        for cls in _spec_classes(core.JitSpec):
            for attr in ("build_and_load", "build", "load", "_build_and_load_jit_fallback"):
                real = cls.__dict__.get(attr)
                if real is None or getattr(real, "__commsim_compiled__", False):
                    continue
                _patched.append((cls, attr, real))
                setattr(cls, attr, _refusing(real))


def _install() -> None:
    _active[0] = True
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    when_imported("flashinfer.jit.core", _patch_jit)


def _uninstall() -> None:
    _active[0] = False
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    with _lock:
        while _patched:
            cls, attr, real = _patched.pop()
            setattr(cls, attr, real)


install, uninstall = nested(_install, _uninstall)
register_surface("compiled CUDA extensions", install, uninstall)
