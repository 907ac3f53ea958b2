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

The pre-namespace names `cuda.cudart`, `cuda.cuda` and `cuda.nvrtc` exist only where the
installed cuda-python has them: 12.6.1-12.9 shipped them as trampolines that import
`cuda.bindings.runtime` / `.driver` (cuda-python 12.6.1 release notes), so there they
reach the stand-ins; cuda-bindings 13.0.0 removed them (release notes, "Breaking
changes"), and commsim does not add them back. Libraries probe for them
(`importlib.util.find_spec("cuda.cudart")` in FlashInfer's `cuda_utils.py` picks the 12.x
or the 13.x import branch), so a name served where the installed package lacks it sends
them down a branch that cannot import.

Each stand-in carries the real module's `__spec__`, `__file__`, `__loader__` and
`__package__`: `importlib.util.find_spec` of an imported module reads its `__spec__`
(ValueError when None), and version probes read `__file__`.

A reference taken before installation (`from cuda.bindings import driver` at the top of a
module imported earlier) keeps the real module, except in the library modules HOLDERS
names: the hosting bootstrap installs at interpreter start, before user code runs, and the
pytest plugin before it collects (install/stale.py finds what an interpreter that imported
user code first still holds).
"""

from __future__ import annotations

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
        for attr in ("__spec__", "__file__", "__loader__", "__package__"):
            if hasattr(real, attr):
                self.__dict__[attr] = getattr(real, attr)
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


def standin(name: str) -> HostedCudaModule:
    return _STANDIN[name]


def simulated_functions() -> dict[str, tuple[str, ...]]:
    """Module name -> the API functions commsim answers (the surface's exact list)."""
    return {n: tuple(sorted(m.__dict__["_impl"])) for n, m in _STANDIN.items()}


def _install(patches: Patches) -> None:
    for name, mod in _STANDIN.items():
        patches.module(name, mod)
        patches.attr(_pkg, name.rsplit(".", 1)[1], mod)
    for holder, names in HOLDERS.items():
        patches.on_import(holder, lambda m, names=names: _rebind(patches, m, names))


# Modules of other libraries that keep cuda-python's modules in a global from their import
# on (module -> global -> the module it holds). torch imports them with torch.cuda, often
# before hosting installs (the launcher's own import of torch), so they get the stand-ins
# there. torch 2.13: torch/cuda/_utils.py (`_check_cuda_bindings`) and torch/cuda/graphs.py
# take `from cuda.bindings import ...` at their top.
HOLDERS = {"torch.cuda._utils": {"_cuda_bindings_runtime": RUNTIME},
           "torch.cuda.graphs": {"_cuda_driver": DRIVER, "_cuda_runtime": RUNTIME}}


def _rebind(patches: Patches, module: types.ModuleType, names: dict[str, str]) -> None:
    for attr, name in names.items():
        if getattr(module, attr, None) is _REAL[name]:
            patches.attr(module, attr, _STANDIN[name])


SURFACE = register_surface("cuda-python", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
