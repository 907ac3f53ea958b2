"""`cuda.bindings.runtime` and `cuda.bindings.driver` as a hosted rank sees them.

Installing the surface replaces both modules (in sys.modules and as attributes of the
`cuda.bindings` package) by stand-ins. On each attribute lookup a stand-in answers:
- an API function commsim simulates (surfaces/cuda/runtime_api, driver_api, driver_vmm): that function,
  which serves the rank running the call (session.current());
- any other name of the real module (enums, structs, handle types, constants,
  `cudaGetErrorString`/`cudaGetErrorName`, which need no GPU): the real object, so types
  are the binding's own (`isinstance(h, cuda.bindings.driver.CUmemFabricHandle)` holds);
- a real API function commsim does not simulate: inside a hosted rank a stand-in raising
  NotImplementedError naming it; outside one, the real function.
Outside any hosted rank (the launcher's own threads) every name is the real module's.

cuda-python 12.6.1-12.9 also answered the pre-namespace names `cuda.cudart` and `cuda.cuda`
(trampolines to `cuda.bindings.runtime` / `.driver`, each warning DeprecationWarning on
import; cuda-python 12.6.1 release notes), and 13.0 removed them (cuda-bindings 13.0.0
release notes, "Breaking changes"). Code written against 12.x (TensorRT-LLM's
`from cuda import cuda, cudart`) is common, so where the installed cuda-python no longer has
them the surface serves both names as the same stand-ins, warning as 12.x did. Where the
installed cuda-python still has them, its own trampolines import the stand-ins.

A reference taken before installation (`from cuda.bindings import driver` at import time
of a module imported earlier) keeps the real module: the hosting bootstrap installs at
interpreter start, before user code runs.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
import warnings
from typing import Any

import cuda.bindings as _pkg
from cuda.bindings import driver as _real_driver
from cuda.bindings import runtime as _real_runtime

from commsim.hosting.surfaces.cuda import driver_api as cuda_driver_api
from commsim.hosting.surfaces.cuda import driver_vmm as cuda_driver_vmm
from commsim.hosting.surfaces.cuda import runtime_api as cuda_runtime_api
from commsim.hosting.install.dispatch import not_simulated
from commsim.hosting.state.session import hosted
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface

RUNTIME = "cuda.bindings.runtime"
DRIVER = "cuda.bindings.driver"
_REAL = {RUNTIME: _real_runtime, DRIVER: _real_driver}
_PURE = frozenset({"cudaGetErrorString", "cudaGetErrorName"})


def _is_api(name: str, value: Any) -> bool:
    return name.startswith("cu") and callable(value) and not isinstance(value, type)


class HostedCudaModule(types.ModuleType):
    """The stand-in for one of the two cuda-python modules."""

    def __init__(self, name: str, *impls: types.ModuleType):
        real = _REAL[name]
        super().__init__(name, real.__doc__)
        self.__file__ = getattr(real, "__file__", None)
        self.__dict__["_real"] = real
        self.__dict__["_impl"] = {n: getattr(impl, n) for impl in impls for n in impl.SIMULATED
                                  if n not in _PURE and hasattr(real, n)}

    def __getattr__(self, name: str) -> Any:
        real = self.__dict__["_real"]
        value = getattr(real, name)          # AttributeError exactly as the real module
        if not _is_api(name, value) or name in _PURE:
            return value
        if hosted() is None:
            return value                     # not a hosted rank: the real binding
        impl = self.__dict__["_impl"].get(name)
        return impl if impl is not None else not_simulated(f"{self.__name__}.{name}")

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self.__dict__["_real"])))

    def __repr__(self) -> str:
        return f"<commsim hosted module {self.__name__}>"


_STANDIN = {RUNTIME: HostedCudaModule(RUNTIME, cuda_runtime_api),
            DRIVER: HostedCudaModule(DRIVER, cuda_driver_api, cuda_driver_vmm)}
# Pre-13.0 name -> the module it forwarded to (cuda-python 12.6.1 release notes).
LEGACY = {"cuda.cudart": RUNTIME, "cuda.cuda": DRIVER}


def standin(name: str) -> HostedCudaModule:
    return _STANDIN[name]


def simulated_functions() -> dict[str, tuple[str, ...]]:
    """Module name -> the API functions commsim answers (the surface's exact list)."""
    return {n: tuple(sorted(m.__dict__["_impl"])) for n, m in _STANDIN.items()}


class _LegacyFinder:
    """Finds `cuda.cudart` / `cuda.cuda` when the installed cuda-python has no such module:
    the import gives the stand-in it forwarded to, with 12.x's DeprecationWarning."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in LEGACY:
            return None
        return importlib.machinery.ModuleSpec(fullname, _LegacyLoader(), origin="commsim hosting")


class _LegacyLoader:
    @staticmethod
    def create_module(spec: Any) -> Any:
        target = LEGACY[spec.name]
        warnings.warn(f"The {spec.name} module is deprecated and will be removed in a future "
                      f"release, please switch to use the {target} module instead.",
                      DeprecationWarning, stacklevel=3)
        module = _STANDIN[target]
        _specs[spec.name] = module.__dict__.get("__spec__")
        return module

    @staticmethod
    def exec_module(module: Any) -> None:
        # The stand-in is shared with its cuda.bindings name: importlib has just set its
        # __spec__ to the old name's; give it back its own.
        for name, target in LEGACY.items():
            if _STANDIN[target] is module and name in _specs:
                module.__spec__ = _specs.pop(name)


_specs: dict[str, Any] = {}


def _legacy_missing() -> bool:
    try:
        return all(importlib.util.find_spec(n) is None for n in LEGACY)
    except (ImportError, ValueError):
        return True


def _install(patches: Patches) -> None:
    for name, mod in _STANDIN.items():
        patches.module(name, mod)
        patches.attr(_pkg, name.rsplit(".", 1)[1], mod)
    if _legacy_missing():
        patches.finder(_LegacyFinder(), LEGACY, lambda module: module in _STANDIN.values())


SURFACE = register_surface("cuda-python", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
