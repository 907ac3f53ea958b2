"""Library classes that keep one process's state in class attributes: what in-process ranks
cannot share, found at the first call that builds that state.

In inproc mode the ranks are greenlets of one interpreter, so a class attribute is one value
for every rank. FlashInfer 0.7.2.post1's `MnnvlMemory` (flashinfer/comm/mnnvl.py) keeps the
process's communicator (`comm`), device (`dev_id`), the virtual address range it reserved for
every rank's segment (`current_start_address`, `current_rank_stride`, `current_mem_offset`),
its allocations (`allocated_map`, `address_refcnt`) and the FABRIC decision
(`_fabric_supported`) there. Two inproc ranks would map into one rank's reservation with the
other rank's communicator: rank 1's `cuMemMap` fails with CUDA_ERROR_INVALID_VALUE and rank
0's import of rank 1's handle with another error, neither saying why.

SGLang 0.5.23 keeps its process groups in module globals of
sglang/srt/distributed/parallel_state.py (`_WORLD`, built by `init_distributed_environment`;
its P2P check then calls `get_world_group().barrier()`): in-process ranks would share one
world group, and rank 0 would wait on rank 1's.

So in a hosted inproc rank the functions declared in `PER_PROCESS` raise `NeedsProcesses` with
the reason below; the inproc runner ends the run and `commsim exec` runs it again in procs
mode, saying so in the verdict (as for sockets between ranks, sockets.py). Outside an inproc
rank, and in procs mode, every call is the real one.
"""

from __future__ import annotations

from typing import Any, Callable

from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import hosted
from commsim.hosting.surfaces.sockets import NeedsProcesses, call_site

__all__ = ["PER_PROCESS", "CLASS_STATE"]

CLASS_STATE = ("the library keeps one process's state in class attributes or module globals, "
               "which in-process ranks would share")
# module -> class ("" for the module's own functions) -> the functions whose first call
# builds that state.
PER_PROCESS: dict[str, dict[str, tuple[str, ...]]] = {
    "flashinfer.comm.mnnvl": {"MnnvlMemory": ("open_mnnvl_memory",)},
    "sglang.srt.distributed.parallel_state": {"": ("init_distributed_environment",)},
}


def _guarded(label: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is not None and r.mode == "inproc":
            raise NeedsProcesses(label, call_site((__file__,)), CLASS_STATE)
        return real(*args, **kwargs)
    call.__name__ = call.__qualname__ = getattr(real, "__name__", label)
    call.__doc__ = real.__doc__
    return call


def _patch(patches: Patches, classes: dict[str, tuple[str, ...]], module: Any) -> None:
    for cls_name, methods in classes.items():
        cls = getattr(module, cls_name, None) if cls_name else module
        if cls is None:
            continue                          # a release without the class: nothing shared
        owner = cls_name or module.__name__.rpartition(".")[2]
        for name in methods:
            own = vars(cls).get(name)
            if isinstance(own, (staticmethod, classmethod)):
                wrapped = type(own)(_guarded(f"{owner}.{name}", own.__func__))
            elif own is not None:
                wrapped = _guarded(f"{owner}.{name}", own)
            else:
                continue
            patches.attr(cls, name, wrapped)


def _install(patches: Patches) -> None:
    for module, classes in PER_PROCESS.items():
        patches.on_import(module, lambda m, c=classes: _patch(patches, c, m))


SURFACE = register_surface("class_state", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
