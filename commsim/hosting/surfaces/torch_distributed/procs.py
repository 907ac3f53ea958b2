"""torch.distributed in procs mode: the real thing (gloo) in real processes.

The CPU build of torch has no NCCL, so a hosted program that asks for backend "nccl" (or
"cpu:gloo,cuda:nccl") gets gloo (and so does one that names no backend on a CUDA build, whose
default for a CUDA device is NCCL), which serves its CPU tensors and object collectives; the
substitution is noted in the rank's verdict. A `device_id` naming a CUDA device is dropped.
The rank's CUDA tensors (torch/tensors.py) reach gloo as the CPU tensors over their
simulated device memory, so a collective reads and writes the device's bytes in place.
Everything else is torch's own code.
"""

from __future__ import annotations

import functools
from typing import Any

from torch.utils._pytree import tree_leaves, tree_map

from commsim.hosting.state.session import hosted
from commsim.hosting.install.registry import wrap_torch_distributed
from commsim.hosting.surfaces.torch.graphs import check_outside_capture
from commsim.hosting.surfaces.torch.tensors import inner_of


def _gloo(backend: Any) -> Any:
    if backend is None:
        return None
    text = str(backend)
    return "gloo" if "nccl" in text.lower() else backend


def _default_picks_nccl() -> bool:
    """Whether torch, given no backend, would bind NCCL to the rank's CUDA device: a CUDA
    build does (its BackendConfig maps the current accelerator through
    `Backend.default_device_backend_map`, cuda -> nccl, torch/distributed/distributed_c10d.py
    in torch 2.14.0), and the hosted rank's accelerator is CUDA; ProcessGroupNCCL then
    fails on a machine without a driver ("no GPUs found"). The CPU build has no NCCL and
    takes gloo by itself."""
    import torch.distributed as dist
    return dist.is_nccl_available()


def _wrap_init(real: Any) -> Any:
    @functools.wraps(real)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is not None and r.mode == "procs":
            if backend is not None and _gloo(backend) != backend:
                r.events.note(f"backend {backend!r} served by gloo")
                backend = "gloo"
            elif backend is None and _default_picks_nccl():
                r.events.note("backend None (torch's default for a CUDA device: nccl) served by gloo")
                backend = "gloo"
            kwargs.pop("device_id", None)
        return real(backend, *args, **kwargs)
    return init_process_group


def _wrap_new_group(real: Any) -> Any:
    @functools.wraps(real)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is not None and r.mode == "procs":
            if "backend" in kwargs:
                kwargs["backend"] = _gloo(kwargs["backend"])
            kwargs.pop("device_id", None)
        return real(*args, **kwargs)
    return new_group


# The collectives whose tensors gloo reads and writes.
TENSOR_CALLS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                "reduce_scatter_tensor", "reduce_scatter", "reduce", "gather", "scatter", "send",
                "recv", "isend", "irecv", "all_to_all", "all_to_all_single")


def _wrap_tensors(real: Any) -> Any:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is not None and r.mode == "procs":
            for t in tree_leaves((args, kwargs)):
                check_outside_capture(t, f"torch.distributed.{real.__name__}")
            args, kwargs = tree_map(inner_of, args), tree_map(inner_of, kwargs)
        return real(*args, **kwargs)
    return call


wrap_torch_distributed("torch.distributed (procs)",
                       {"init_process_group": _wrap_init, "new_group": _wrap_new_group,
                        **{name: _wrap_tensors for name in TENSOR_CALLS}})
