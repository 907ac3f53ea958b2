"""The compiled-extension surface: a hosted rank that loads a compiled CUDA extension
declared in `extensions.py` gets the named error (or, once ops are served, the served module)
instead of an unnamed loader error, and no JIT build starts.

Two ways in:
- Python extension modules (`import vllm._C_stable_libtorch`): a finder ahead of the others
  takes the path finder's spec of the module and, in a hosted rank, gives it a loader that
  raises, or, where the declaration serves ops, one that makes a module in place of the
  extension and registers its served ops with torch.library (served_torch_ops.py). So
  `importlib.util.find_spec` still answers as installed; only the load differs.
- FlashInfer's JIT modules: once `flashinfer.jit.core` is imported, `JitSpec.build_and_load`
  and every spec class's `build` and `load` are answered in a hosted rank before anything
  runs (no ninja, nvcc or CuTe-DSL process; no AOT `.so` loaded): loading a module with
  served ops gives its `ServedModule` (served.py), which is what FlashInfer's
  `get_*_module()` wraps; loading any other module, or building one that is not served,
  is the named error. Outside a hosted rank both are the library's own.
- sglang-kernel's `common_ops`: `sgl_kernel/__init__` loads it from a file path
  (`load_utils._load_architecture_specific_ops`, `spec_from_file_location`), past the
  finders; once `sgl_kernel.load_utils` is imported, that function gives, in a hosted rank,
  a module in place of the extension with the served ops registered, or the named error,
  before any `.so` is opened.
- Compiler processes: FlashInfer asks `nvcc --list-gpu-arch` while it generates a JIT spec
  (`compilation_context._nvcc_supports_sm107`), before any load; Triton runs ptxas. In a
  hosted rank `subprocess` does not start a CUDA compiler or build tool (`COMPILERS`): the
  start raises `CompilerNotStarted`, a FileNotFoundError naming the program, which is what
  a caller that probes for a toolchain handles when there is none.
"""

from __future__ import annotations

import errno
import functools
import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import types
from typing import Any

from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import hosted
from commsim.hosting.surfaces.compiled.extensions import EXTENSIONS, REFUSED_SCHEMAS, declared, \
    not_served_error
from commsim.hosting.surfaces.compiled.served import ServedModule

_IMPORTED = frozenset(e.module for e in EXTENSIONS if e.kind == "import")
# Programs that compile or build device code, by file name.
COMPILERS = frozenset({"nvcc", "ptxas", "cicc", "cudafe++", "fatbinary", "nvlink", "ninja"})
_active = [False]
_patches: list[Patches] = []          # the installed surface's recorder (served ops go through it)


class CompilerNotStarted(FileNotFoundError):
    """A hosted rank tried to start a CUDA compiler or build tool."""


def _program(args: Any, executable: Any) -> str:
    first = executable or (args if isinstance(args, (str, bytes, os.PathLike)) else
                           next(iter(args), ""))
    name = os.fsdecode(first)
    return os.path.basename(name.split()[0] if isinstance(args, str) and not executable
                            else name)


def _no_compiler(real: Any) -> Any:
    @functools.wraps(real)
    def execute_child(self: Any, args: Any, executable: Any, *rest: Any) -> Any:
        prog = _program(args, executable)
        if prog in COMPILERS and _active[0] and hosted() is not None:
            raise CompilerNotStarted(
                errno.ENOENT, f"commsim hosting: {prog} is not started in a hosted rank (no "
                f"JIT build or compiler process runs there; served compiled ops need none)", prog)
        return real(self, args, executable, *rest)
    return execute_child


class _RefusingLoader(importlib.abc.Loader):
    def __init__(self, name: str) -> None:
        self.name = name

    def create_module(self, spec: Any) -> Any:
        raise not_served_error("import", self.name)

    def exec_module(self, module: Any) -> None:       # never reached: create_module raised
        raise not_served_error("import", self.name)


def _served_module(kind: str, name: str, ext: Any) -> types.ModuleType:
    """A module in place of the extension `name`, its served ops registered."""
    module = types.ModuleType(name)
    module.__commsim_served__ = True                  # type: ignore[attr-defined]
    _serve(_patches[-1], kind, name, ext)
    return module


class _ServingLoader(importlib.abc.Loader):
    """A module in place of the extension (an extension module holds no Python attributes
    of its own); executing it registers the declared ops, as loading the library does."""

    def __init__(self, name: str, ext: Any) -> None:
        self.name = name
        self.ext = ext

    def create_module(self, spec: Any) -> Any:
        return None                                   # a plain module, with spec's attributes

    def exec_module(self, module: Any) -> None:
        module.__commsim_served__ = True
        _serve(_patches[-1], "import", self.name, self.ext)


def _serve(patches: Patches, kind: str, name: str, ext: Any) -> None:
    from commsim.hosting.surfaces.compiled import served_torch_ops
    served_torch_ops.register(patches, ext.served,
                    {n: REFUSED_SCHEMAS[n] for n in ext.not_served if n in REFUSED_SCHEMAS},
                    lambda: not_served_error(kind, name))


def _serve_loaded(patches: Patches) -> None:
    """In-process runs share sys.modules: a library imported by an earlier run keeps the
    served module and does not import it again, so its ops are registered for this run too
    (restore() removed them at the end of the last)."""
    loaded = [("import", name, sys.modules.get(name)) for name in _IMPORTED]
    loaded.append(("sgl_kernel", "common_ops", getattr(sys.modules.get("sgl_kernel"), "common_ops", None)))
    for kind, name, module in loaded:
        if getattr(module, "__commsim_served__", False):
            ext, _, _ = declared(kind, name)
            if ext is not None and ext.served:
                _serve(patches, kind, name, ext)


def _loader(name: str) -> importlib.abc.Loader:
    ext, _, _ = declared("import", name)
    return _ServingLoader(name, ext) if ext is not None and ext.served else _RefusingLoader(name)


class _ExtensionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _IMPORTED or not _active[0] or hosted() is None:
            return None
        # Extension modules are files on the package's path: the path finder's spec, with a
        # loader that refuses.
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _loader(name)
        return spec


_finder = _ExtensionFinder()


def _served_or_refused(attr: str, name: str) -> Any:
    """What `spec.<attr>()` gives in a hosted rank for the JIT module `name`."""
    ext, _, _ = declared("flashinfer-jit", name)
    if ext is None or not ext.served:
        raise not_served_error("flashinfer-jit", name)
    # A served module has nothing to build: `build` is done, the loads give the stand-in.
    return None if attr == "build" else ServedModule(ext, "flashinfer-jit")


def _refusing(real: Any, attr: str) -> Any:
    @functools.wraps(real)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _active[0] and hosted() is not None:
            return _served_or_refused(attr, getattr(self, "name", type(self).__name__))
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


def _patch_jit(patches: Patches, core: Any) -> None:
    for cls in _spec_classes(core.JitSpec):
        for attr in ("build_and_load", "build", "load", "_build_and_load_jit_fallback"):
            real = cls.__dict__.get(attr)
            if real is not None and not getattr(real, "__commsim_compiled__", False):
                patches.attr(cls, attr, _refusing(real, attr))


def _sgl_kernel_ops(real: Any) -> Any:
    @functools.wraps(real)
    def load() -> Any:
        if not (_active[0] and hosted() is not None):
            return real()
        ext, _, _ = declared("sgl_kernel", "common_ops")
        if ext is None or not ext.served:
            raise not_served_error("sgl_kernel", "common_ops")
        return _served_module("sgl_kernel", "common_ops", ext)
    load.__commsim_compiled__ = True                  # type: ignore[attr-defined]
    return load


def _patch_sgl_kernel(patches: Patches, load_utils: Any) -> None:
    real = load_utils._load_architecture_specific_ops
    if not getattr(real, "__commsim_compiled__", False):
        patches.attr(load_utils, "_load_architecture_specific_ops", _sgl_kernel_ops(real))


def _deactivate() -> None:
    _active[0] = False
    _patches.clear()


def _install(patches: Patches) -> None:
    _active[0] = True
    _patches.append(patches)
    _serve_loaded(patches)
    patches.on_restore(_deactivate)
    patches.finder(_finder, first=True)
    patches.attr(subprocess.Popen, "_execute_child", _no_compiler(subprocess.Popen._execute_child))
    patches.on_import("flashinfer.jit.core", lambda core: _patch_jit(patches, core))
    patches.on_import("sgl_kernel.load_utils", lambda lu: _patch_sgl_kernel(patches, lu))


SURFACE = register_surface("compiled CUDA extensions", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
