"""torch.distributed in procs mode: the real thing (gloo) in real processes, and
ProcessGroupNCCL over the rank's simulated NCCL.

The CPU build of torch has no NCCL, so a group whose backend binds CUDA to NCCL ("nccl",
"cpu:gloo,cuda:nccl", or none on a CUDA build) is made as a gloo group, which serves a mixed
group's CPU tensors and object collectives, and remembered: its all_reduce, broadcast,
barrier, all_gather (list and into_tensor) and reduce_scatter_tensor on CUDA tensors run as
ProcessGroupNCCL does over the simulated NCCL (pg_nccl.py: the communicator made lazily, or
at the call with `device_id`; the unique id broadcast over the gloo group), as in inproc
mode; a pure "nccl" group also moves all_gather_object / broadcast_object_list over NCCL and
refuses CPU tensors, and get_backend names the backend asked for. The
substitution is noted in the rank's verdict. The rank's other CUDA tensors
(torch/tensors.py) reach gloo as the CPU tensors over their simulated device memory, so a
collective reads and writes the device's bytes in place. Everything else is torch's own code.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from torch.utils._pytree import tree_leaves, tree_map

from commsim.hosting.state.session import hosted
from commsim.hosting.install.registry import wrap_torch_distributed
from commsim.hosting.surfaces.torch.graphs import check_outside_capture
from commsim.hosting.surfaces.torch.tensors import inner_of
from commsim.hosting.surfaces.torch_distributed import pg_nccl


def _gloo(backend: Any) -> Any:
    if backend is None:
        return None
    text = str(backend)
    return "gloo" if "nccl" in text.lower() else backend


class _Groups:
    """This process's groups that bind CUDA to NCCL: (group, backend, ProcessGroupNCCL)
    by the group object's id (the process is one rank: one table)."""

    def __init__(self) -> None:
        self.backend: dict[int, tuple[Any, str]] = {}
        self.nccl: dict[int, pg_nccl.GroupNccl] = {}
        self.timeout: Any = None
        self.sharing = False        # a unique id on its way over the gloo group

    def clear(self) -> None:
        for g in self.nccl.values():        # ProcessGroupNCCL's shutdown destroys its comms
            g.close()
        self.backend.clear()
        self.nccl.clear()


_groups = _Groups()


def _world() -> Any:
    import torch.distributed.distributed_c10d as c10d
    return c10d._get_default_group()


def _key(group: Any) -> Any:
    return _world() if group is None else group


def _nccl_of(group: Any) -> pg_nccl.GroupNccl:
    import torch.distributed as dist
    pg = _key(group)
    g = _groups.nccl.get(id(pg))
    if g is None:
        g = _groups.nccl[id(pg)] = pg_nccl.GroupNccl(
            dist.get_rank(pg), dist.get_world_size(pg), pg_nccl.timeout_ms(_groups.timeout))
    return g


# torch's own broadcast_object_list, which the unique id travels by (the wrapper below
# would send a pure "nccl" group's objects over NCCL, the communicator being made).
_real: dict[str, Any] = {}


def _share(group: Any) -> pg_nccl.Share:
    """Group rank 0's unique id to every rank, over the gloo group (ProcessGroupNCCL sends
    it through the group's store)."""
    import torch.distributed as dist

    def share(blob: bytes | None) -> bytes:
        pg = _key(group)
        box = [blob]
        _groups.sharing = True      # the exchange itself is gloo's (not the group's NCCL)
        try:
            _real.get("broadcast_object_list", dist.broadcast_object_list)(
                box, src=dist.get_global_rank(pg, 0), group=pg)
        finally:
            _groups.sharing = False
        return box[0]
    return share


def _remember(group: Any, backend: str, device_id: Any) -> None:
    """A group made with `backend`; with `device_id`, its communicator made now."""
    _groups.backend[id(group)] = (group, backend)
    if device_id is not None and pg_nccl.uses_nccl(backend, "cuda"):
        import torch
        dev = torch.device("cuda", device_id) if isinstance(device_id, int) else torch.device(device_id)
        r = hosted()
        pg_nccl.connect(r, _nccl_of(group), dev.index or 0, _share(group))


def _backend_of(group: Any) -> str:
    entry = _groups.backend.get(id(_key(group)))
    return entry[1] if entry is not None else "gloo"


def _wrap_get_backend(real: Any) -> Any:
    """The backend a group was made with, lower case, as torch's get_backend answers it
    (the gloo group standing in for an NCCL one would say "gloo")."""
    @functools.wraps(real)
    def get_backend(group: Any = None) -> Any:
        r = hosted()
        if r is None or r.mode != "procs" or id(_key(group)) not in _groups.backend:
            return real(group)
        return _backend_of(group).lower()
    return get_backend


def _wrap_objects(real: Any) -> Any:
    """all_gather_object / broadcast_object_list: over NCCL on a group whose only backend
    is NCCL (pickled into CUDA tensors, pg_nccl.py), else torch's own over gloo."""
    name = real.__name__
    _real[name] = real
    sig = inspect.signature(real)

    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is None or r.mode != "procs":
            return real(*args, **kwargs)
        a = sig.bind(*args, **kwargs).arguments
        group = a.get("group")
        if not pg_nccl.barrier_uses_nccl(_backend_of(group)):
            return real(*args, **kwargs)
        if name == "all_gather_object":
            a["object_list"][:] = pg_nccl.all_gather_object(r, _nccl_of(group), _share(group),
                                                            a["obj"])
        else:
            pg_nccl.broadcast_object_list(r, _nccl_of(group), _share(group), a["object_list"],
                                          _group_root(sig.bind(*args, **kwargs)))
        return None
    return call


def _wrap_init(real: Any) -> Any:
    @functools.wraps(real)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is None or r.mode != "procs":
            return real(backend, *args, **kwargs)
        asked = str(backend) if backend is not None else pg_nccl.default_backend()
        if _gloo(asked) != asked:
            r.events.note(f"backend {asked!r}: CUDA tensors over the simulated NCCL "
                          f"(ProcessGroupNCCL), CPU tensors and objects served by gloo")
        device_id = kwargs.pop("device_id", None)
        _groups.timeout = kwargs.get("timeout")
        out = real("gloo" if _gloo(asked) != asked else backend, *args, **kwargs)
        _remember(_world(), asked, device_id)
        return out
    return init_process_group


def _wrap_new_group(real: Any) -> Any:
    @functools.wraps(real)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is None or r.mode != "procs":
            return real(*args, **kwargs)
        asked = str(kwargs.get("backend") or _backend_of(None))
        kwargs["backend"] = _gloo(asked)
        device_id = kwargs.pop("device_id", None)
        group = real(*args, **kwargs)
        import torch.distributed as dist
        if group is not dist.GroupMember.NON_GROUP_MEMBER:
            _remember(group, asked, device_id)
        return group
    return new_group


def _wrap_destroy(real: Any) -> Any:
    @functools.wraps(real)
    def destroy_process_group(group: Any = None) -> Any:
        r = hosted()
        if r is not None and r.mode == "procs" and group is None:
            _groups.clear()
        return real(group)
    return destroy_process_group


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


def _over_nccl(name: str, bound: inspect.BoundArguments, tensor: str | None) -> bool:
    """Whether this call of a ProcessGroupNCCL collective runs on the simulated NCCL: its
    group's backend binds the tensor's device (barrier: the group's only backend) to NCCL."""
    group = bound.arguments.get("group")
    backend = _backend_of(group)
    if _groups.sharing:
        return False
    if tensor is None:
        return pg_nccl.barrier_uses_nccl(backend)
    t = bound.arguments[tensor]
    pg_nccl.refuse_cpu(backend, t)
    if not pg_nccl.uses_nccl(backend, "cuda" if getattr(t, "is_cuda", False) else "cpu"):
        return False
    check_outside_capture(t, f"torch.distributed.{name}")
    return True


def _group_root(bound: inspect.BoundArguments) -> int:
    import torch.distributed as dist
    a = bound.arguments
    if a.get("group_src") is not None:
        return int(a["group_src"])
    return dist.get_group_rank(_key(a.get("group")), int(a.get("src") or 0))


# ProcessGroupNCCL's collectives: name -> (its tensor argument, the call over NCCL).
NCCL_CALLS: dict[str, tuple[str | None, Callable[[Any, Any], None]]] = {
    "all_reduce": ("tensor", lambda r, a: pg_nccl.all_reduce(
        r, _nccl_of(a.arguments.get("group")), _share(a.arguments.get("group")),
        a.arguments["tensor"], a.arguments.get("op"))),
    "broadcast": ("tensor", lambda r, a: pg_nccl.broadcast(
        r, _nccl_of(a.arguments.get("group")), _share(a.arguments.get("group")),
        a.arguments["tensor"], _group_root(a))),
    "all_gather": ("tensor", lambda r, a: pg_nccl.all_gather(
        r, _nccl_of(a.arguments.get("group")), _share(a.arguments.get("group")),
        a.arguments["tensor_list"], a.arguments["tensor"])),
    "barrier": (None, lambda r, a: pg_nccl.barrier(
        r, _nccl_of(a.arguments.get("group")), _share(a.arguments.get("group")))),
    "all_gather_into_tensor": ("input_tensor", lambda r, a: pg_nccl.all_gather_into_tensor(
        r, _nccl_of(a.arguments.get("group")), _share(a.arguments.get("group")),
        a.arguments["output_tensor"], a.arguments["input_tensor"])),
    "reduce_scatter_tensor": ("input", lambda r, a: pg_nccl.reduce_scatter_tensor(
        r, _nccl_of(a.arguments.get("group")), _share(a.arguments.get("group")),
        a.arguments["output"], a.arguments["input"], a.arguments.get("op"))),
}


def _wrap_nccl(real: Any) -> Any:
    """A ProcessGroupNCCL collective: over the simulated NCCL where the group binds the
    tensor's device to it, else gloo's (with the tensor's bytes, _wrap_tensors)."""
    name = real.__name__
    tensor, run = NCCL_CALLS[name]
    sig = inspect.signature(real)
    other = _wrap_tensors(real) if name in TENSOR_CALLS else real

    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is None or r.mode != "procs":
            return real(*args, **kwargs)
        bound = sig.bind(*args, **kwargs)
        if not _over_nccl(name, bound, tensor):
            return other(*args, **kwargs)
        run(r, bound)
        return pg_nccl.Completed() if bound.arguments.get("async_op") else None
    return call


wrap_torch_distributed("torch.distributed (procs)",
                       {"init_process_group": _wrap_init, "new_group": _wrap_new_group,
                        "destroy_process_group": _wrap_destroy, "get_backend": _wrap_get_backend,
                        "all_gather_object": _wrap_objects,
                        "broadcast_object_list": _wrap_objects,
                        **{name: _wrap_tensors for name in TENSOR_CALLS},
                        **{name: _wrap_nccl for name in NCCL_CALLS}})
