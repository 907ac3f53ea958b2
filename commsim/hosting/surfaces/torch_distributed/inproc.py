"""torch.distributed for inproc ranks: the calls answered for the running rank.

In inproc mode the ranks are greenlets of one interpreter under commsim's seeded scheduler,
so torch.distributed's functions are replaced by dispatchers: called from an inproc rank they
run over the rank's `commsim.group.local.LocalGroup` (matching, by-value pickling, hang and
mismatch diagnosis as for commsim's own groups); called from anywhere else they are the real
functions. Served: init_process_group, is_initialized, destroy_process_group, get_rank,
get_world_size, get_backend, new_group, get_process_group_ranks, get_global_rank,
get_group_rank, all_gather_object, broadcast_object_list, gather_object, barrier, and
all_reduce / all_gather / broadcast / all_gather_into_tensor / reduce_scatter_tensor, in
place, on CPU tensors and on the rank's CUDA tensors (torch/tensors.py: their bytes are the
simulated device memory, read and written where they are). Any other collective fails
loudly, naming itself. A group whose backend binds CUDA to NCCL ("nccl", "cpu:gloo,cuda:nccl",
or none on a CUDA build) runs all_reduce, broadcast, barrier, all_gather (list and
into_tensor) and reduce_scatter_tensor on CUDA tensors as ProcessGroupNCCL does, over the
rank's simulated NCCL (pg_nccl.py). A group whose only backend is "nccl" also moves
all_gather_object and broadcast_object_list over NCCL (pickled into CUDA tensors, as torch
does) and refuses CPU tensors as torch does; a mixed group serves its CPU tensors and objects
as gloo's. get_backend names the backend the group was made with.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from commsim.hosting.state.session import HostedRank, hosted, user_site
from commsim.hosting.install.dispatch import not_simulated, per_rank
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface, wrap_torch_distributed
from commsim.hosting.surfaces.torch.graphs import check_outside_capture
from commsim.hosting.surfaces.torch.tensors import inner_of
from commsim.hosting.surfaces.torch_distributed import pg_nccl

KEY = "torch.distributed"
NOT_SIMULATED = tuple("""
    reduce reduce_scatter all_to_all
    all_to_all_single send recv isend irecv scatter gather scatter_object_list
    batch_isend_irecv monitored_barrier all_gather_coalesced new_subgroups send_object_list
    recv_object_list all_reduce_coalesced""".split())


class HostedGroup:
    """What new_group returns to an inproc rank: its handle on a LocalGroup."""

    def __init__(self, local: Any) -> None:
        self.local = local

    def rank(self) -> int:
        return self.local.rank

    def size(self) -> int:
        return self.local.size

    @property
    def group_name(self) -> str:
        """The name symm_mem.rendezvous and torch.ops.symm_mem take (ProcessGroup.group_name)."""
        return self.local.name

    def __repr__(self) -> str:
        return f"<commsim hosted process group {self.local.name} ranks {list(self.local.global_ranks)}>"


_process_group_class: list[type] = []


def _handle(local: Any) -> HostedGroup:
    """A rank's handle on a LocalGroup that is also a `torch.distributed.ProcessGroup` (built
    over torch's class on first use; this module does not import torch): serving stacks
    branch on `isinstance(group, ProcessGroup)` (vLLM's `in_the_same_node_as` takes its
    ProcessGroup path, else its StatelessProcessGroup one). Its own rank/size/group_name
    come first; torch's methods it does not serve stay torch's."""
    if not _process_group_class:
        from torch.distributed import ProcessGroup

        class HostedProcessGroup(HostedGroup, ProcessGroup):
            def __init__(self, local: Any) -> None:
                ProcessGroup.__init__(self, local.rank, local.size)
                HostedGroup.__init__(self, local)
        _process_group_class.append(HostedProcessGroup)
    return _process_group_class[0](local)


# The Work of an async_op=True call: inproc collectives complete before returning.
_Done = pg_nccl.Completed


class _State:
    def __init__(self) -> None:
        self.world: Any = None      # LocalGroup of the default group, once initialised
        self.backend = ""
        self.groups = 0
        self.made: list[Any] = []   # the LocalGroups new_group gave this rank (by name: symm_mem)
        # What GroupMember.WORLD / group.WORLD / _get_default_group() give this rank: one
        # handle for the run, so `group is dist.group.WORLD` holds as it does for torch's.
        self.world_handle: HostedGroup | None = None
        self.timeout: Any = None    # init_process_group's timeout: every group's default
        self.backends: dict[str, str] = {}                  # group name -> its backend
        self.nccl: dict[str, pg_nccl.GroupNccl] = {}        # group name -> ProcessGroupNCCL
        self.bound: Any = None      # init_process_group's device_id: new groups inherit it


def _inproc() -> HostedRank | None:
    r = hosted()
    return r if r is not None and r.mode == "inproc" else None


def _st(r: HostedRank) -> _State:
    st = r.state.get(KEY)
    if st is None:
        st = r.state[KEY] = _State()
    return st


def _world(r: HostedRank) -> Any:
    st = _st(r)
    if st.world is None:
        raise ValueError("Default process group has not been initialized, please make sure to "
                         "call init_process_group.")
    return st.world


def _group(r: HostedRank, group: Any) -> Any:
    if group is None:
        return _world(r)
    if isinstance(group, HostedGroup):
        return group.local
    import torch.distributed as dist
    if group is dist.GroupMember.WORLD or group is getattr(dist.group, "WORLD", None):
        return _world(r)
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this rank is not a member of the group (new_group returned "
                         "GroupMember.NON_GROUP_MEMBER to it)")
    raise TypeError(f"commsim hosting: group {group!r} is not a group of this hosted run "
                    f"(inproc ranks use the groups torch.distributed.new_group returns)")


def group_by_name(r: HostedRank, name: str) -> Any:
    """The rank's LocalGroup named `name` (the world or one new_group made), or None."""
    st = _st(r)
    for g in [st.world, *st.made]:
        if g is not None and g.name == name:
            return g
    return None


def _tag(name: str) -> str:
    return f"torch.distributed.{name} at {user_site(3, 1)}"


# ---- ProcessGroupNCCL ------------------------------------------------------------------------

def _nccl_of(r: HostedRank, g: Any) -> pg_nccl.GroupNccl:
    st = _st(r)
    pg = st.nccl.get(g.name)
    if pg is None:
        pg = st.nccl[g.name] = pg_nccl.GroupNccl(g.rank, g.size, pg_nccl.timeout_ms(st.timeout))
    return pg


def _backend(r: HostedRank, g: Any) -> str:
    return _st(r).backends.get(g.name, _st(r).backend)


def _over_nccl(r: HostedRank, g: Any, t: Any, what: str) -> pg_nccl.GroupNccl | None:
    """The group's ProcessGroupNCCL where its backend runs this tensor's collective on NCCL
    (a CPU tensor on a pure "nccl" group is refused as torch refuses it)."""
    backend = _backend(r, g)
    pg_nccl.refuse_cpu(backend, t)
    if not pg_nccl.uses_nccl(backend, "cuda" if getattr(t, "is_cuda", False) else "cpu"):
        return None
    check_outside_capture(t, f"torch.distributed.{what}")
    return _nccl_of(r, g)


def _share(g: Any, tag: str) -> pg_nccl.Share:
    """Group rank 0's unique id to every rank (ProcessGroupNCCL's store broadcast)."""
    return lambda blob: g.broadcast_object(blob, 0, tag=f"{tag} (NCCL unique id)")


def _eager(r: HostedRank, g: Any, device_id: Any) -> None:
    """`device_id` given: the group's communicator is made now, on that device."""
    if device_id is None or not pg_nccl.uses_nccl(_st(r).backends[g.name], "cuda"):
        return
    dev = torch.device(device_id) if not isinstance(device_id, int) else torch.device("cuda", device_id)
    pg_nccl.connect(r, _nccl_of(r, g), dev.index if dev.index is not None else 0,
                    _share(g, _tag("init_process_group")))


# ---- the calls ------------------------------------------------------------------------------

def init_process_group(r: HostedRank, backend: Any = None, init_method: Any = None,
                       timeout: Any = None, world_size: int = -1, rank: int = -1,
                       store: Any = None, group_name: str = "", pg_options: Any = None,
                       device_id: Any = None, **kwargs: Any) -> None:
    st = _st(r)
    if st.world is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if rank not in (-1, None) and int(rank) != r.rank:
        raise ValueError(f"commsim hosting: init_process_group(rank={rank}) but this process "
                         f"is rank {r.rank} of the simulated run (RANK={r.rank})")
    if world_size not in (-1, None) and int(world_size) != r.world_size:
        raise ValueError(f"commsim hosting: init_process_group(world_size={world_size}) but the "
                         f"run has {r.world_size} ranks; match --nproc-per-host and the machine")
    st.backend = str(backend or pg_nccl.default_backend())
    if "nccl" in st.backend:
        r.events.note(f"backend {st.backend!r}: CUDA tensors over the simulated NCCL "
                      f"(ProcessGroupNCCL), CPU tensors and objects served in-process as gloo")
    st.world = r.world.group(r.rank)
    st.world_handle = _handle(st.world)
    st.timeout = timeout
    st.backends[st.world.name] = st.backend
    st.bound = device_id
    _eager(r, st.world, device_id)


def is_initialized(r: HostedRank) -> bool:
    return _st(r).world is not None


def destroy_process_group(r: HostedRank, group: Any = None) -> None:
    if group is None:
        st = _st(r)
        for g in st.nccl.values():          # ProcessGroupNCCL's shutdown destroys its comms
            g.close()
        st.nccl.clear()
        st.world = st.world_handle = st.bound = None


def get_rank(r: HostedRank, group: Any = None) -> int:
    g = _group(r, group)
    return g.rank


def get_world_size(r: HostedRank, group: Any = None) -> int:
    return _group(r, group).size


def get_backend(r: HostedRank, group: Any = None) -> str:
    """The group's backend as it was asked for, lower case ("nccl", "gloo",
    "cpu:gloo,cuda:nccl"): torch 2.13.0 distributed_c10d.py get_backend returns
    Backend(pg_map[pg][0])."""
    return _backend(r, _group(r, group)).lower()


def new_group(r: HostedRank, ranks: Any = None, timeout: Any = None, backend: Any = None,
              pg_options: Any = None, use_local_synchronization: bool = False,
              group_desc: Any = None, device_id: Any = None) -> Any:
    import torch.distributed as dist
    world = _world(r)
    st = _st(r)
    st.groups += 1
    members = sorted(int(x) for x in ranks) if ranks is not None else list(range(world.size))
    bad = [x for x in members if not 0 <= x < world.size]
    if bad:
        raise ValueError(f"new_group: ranks {bad} are not in the world of {world.size}")
    sub = world.new_subgroup(members, group_desc or f"group{st.groups}", tag=_tag("new_group"))
    if sub is not None:
        st.made.append(sub)
        st.backends[sub.name] = str(backend or st.backend)
    # torch 2.13: a new group inherits the default group's bound device, and splits its
    # communicator from the world's when that one was made eagerly (pg_nccl.split); every
    # world rank takes part in the split, members or not.
    parent = st.nccl.get(world.name)
    if st.bound is not None and parent is not None and parent.comm \
            and pg_nccl.uses_nccl(str(backend or st.backend), "cuda"):
        pg_nccl.split(r, parent, _nccl_of(r, sub) if sub is not None else None, members)
    elif sub is not None:
        _eager(r, sub, device_id if device_id is not None else st.bound)
    return _handle(sub) if sub is not None else dist.GroupMember.NON_GROUP_MEMBER


def get_process_group_ranks(r: HostedRank, group: Any) -> list[int]:
    return list(_group(r, group).global_ranks)


def get_global_rank(r: HostedRank, group: Any, group_rank: int) -> int:
    return _group(r, group).global_ranks[group_rank]


def get_group_rank(r: HostedRank, group: Any, global_rank: int) -> int:
    g = _group(r, group)
    if global_rank not in g.global_ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return list(g.global_ranks).index(global_rank)


def _group_src(g: Any, src: Any, group_src: Any) -> int:
    if group_src is not None:
        return int(group_src)
    src = 0 if src is None else int(src)
    if src not in g.global_ranks:
        raise ValueError(f"src rank {src} is not part of group {list(g.global_ranks)}")
    return list(g.global_ranks).index(src)


def all_gather_object(r: HostedRank, object_list: list, obj: Any, group: Any = None) -> None:
    g = _group(r, group)
    if len(object_list) != g.size:
        raise ValueError(f"all_gather_object: object_list has {len(object_list)} entries, the "
                         f"group has {g.size} ranks")
    if pg_nccl.barrier_uses_nccl(_backend(r, g)):       # pickled into CUDA tensors, over NCCL
        object_list[:] = pg_nccl.all_gather_object(r, _nccl_of(r, g),
                                                   _share(g, _tag("all_gather_object")), obj)
        return
    object_list[:] = g.all_gather_object(obj, tag=_tag("all_gather_object"))


def broadcast_object_list(r: HostedRank, object_list: list, src: Any = None, group: Any = None,
                          device: Any = None, group_src: Any = None) -> None:
    g = _group(r, group)
    s = _group_src(g, src, group_src)
    if pg_nccl.barrier_uses_nccl(_backend(r, g)):       # pickled into CUDA tensors, over NCCL
        pg_nccl.broadcast_object_list(r, _nccl_of(r, g), _share(g, _tag("broadcast_object_list")),
                                      object_list, s)
        return
    object_list[:] = g.broadcast_object(list(object_list), s, tag=_tag("broadcast_object_list"))


def gather_object(r: HostedRank, obj: Any, object_gather_list: Any = None, dst: Any = None,
                  group: Any = None, group_dst: Any = None) -> None:
    g = _group(r, group)
    d = _group_src(g, dst, group_dst)
    got = g.all_gather_object(obj, tag=_tag("gather_object"))
    if g.rank == d:
        if object_gather_list is None or len(object_gather_list) != g.size:
            raise ValueError("gather_object: on dst, object_gather_list must have one entry per rank")
        object_gather_list[:] = got


def barrier(r: HostedRank, group: Any = None, async_op: bool = False, device_ids: Any = None) -> Any:
    g = _group(r, group)
    if pg_nccl.barrier_uses_nccl(_st(r).backends.get(g.name, _st(r).backend)):
        pg_nccl.barrier(r, _nccl_of(r, g), _share(g, _tag("barrier")))
    else:
        g.barrier(tag=_tag("barrier"))
    return _Done() if async_op else None


# The bitwise ops gloo reduces integral tensors with (SGLang votes with BAND on a CPU
# group); on any other dtype ProcessGroupGloo's toFunction refuses them, as the installed
# torch 2.13.0 answers: RuntimeError "Cannot use ReduceOp.BAND with non-integral dtype".
_BITWISE = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}


def _reduce(op: Any, arrays: list) -> Any:
    import torch.distributed as dist
    R = dist.ReduceOp
    if op == R.SUM:
        return functools.reduce(np.add, arrays)
    if op == R.PRODUCT:
        return functools.reduce(np.multiply, arrays)
    if op == R.MIN:
        return functools.reduce(np.minimum, arrays)
    if op == R.MAX:
        return functools.reduce(np.maximum, arrays)
    if op == R.AVG:
        return functools.reduce(np.add, arrays) / len(arrays)
    for name, fn in _BITWISE.items():
        if op == getattr(R, name):
            return functools.reduce(fn, arrays)
    raise NotImplementedError(f"commsim hosting: torch.distributed.all_reduce op {op} is not simulated")


def _check_op(op: Any, t: Any) -> None:
    """The caller's own error for a bitwise op on a non-integral tensor, on every rank that
    makes the call (gloo checks before it exchanges anything)."""
    import torch.distributed as dist
    for name in _BITWISE:
        if op == getattr(dist.ReduceOp, name) and (t.dtype.is_floating_point or t.dtype.is_complex):
            raise RuntimeError(f"Cannot use ReduceOp.{name} with non-integral dtype")


def _reduce_parts(parts: list, op: Any) -> Any:
    """combine_arrays' fn for all_reduce: the ranks' arrays reduced in rank order."""
    return _reduce(op, list(parts))        # np.add and the others make new arrays


def _stack(parts: list) -> Any:
    """combine_arrays' fn for all_gather: rank i's array at index i (a ragged gather raises
    here, in Python, before any rank copies anything)."""
    return np.stack(parts)


def _host(t: Any, what: str) -> Any:
    """The CPU tensor whose bytes are `t`'s: `t` itself, or a hosted CUDA tensor's inner
    tensor over its simulated device memory (writing it writes the device's bytes)."""
    check_outside_capture(t, f"torch.distributed.{what}")
    h = inner_of(t)
    if h.device.type != "cpu":
        raise RuntimeError(f"commsim hosting: {what}: a tensor on {t.device} is not simulated "
                           f"(CPU tensors and the rank's CUDA tensors are)")
    return h


def _array(h: Any) -> Any:
    """numpy view of a CPU tensor (numpy has no bfloat16: such tensors travel as float32)."""
    return (h.detach().float() if h.dtype == torch.bfloat16 else h.detach()).numpy()


def _store(h: Any, a: Any) -> None:
    """h[...] = a, written into h's own bytes (the combined arrays are shared read-only)."""
    if h.dtype == torch.bfloat16:
        h.copy_(torch.from_numpy(np.array(a, dtype=np.float32)).reshape(h.shape))
    else:
        h.detach().numpy()[...] = np.asarray(a).reshape(h.shape)


def _op(op: Any) -> Any:
    import torch.distributed as dist
    return dist.ReduceOp.SUM if op is None else op


def all_reduce(r: HostedRank, tensor: Any, op: Any = None, group: Any = None,
               async_op: bool = False) -> Any:
    g = _group(r, group)
    pg = _over_nccl(r, g, tensor, "all_reduce")
    if pg is not None:
        pg_nccl.all_reduce(r, pg, _share(g, _tag("all_reduce")), tensor, op)
        return _Done() if async_op else None
    h = _host(tensor, "all_reduce")
    _check_op(_op(op), h)
    # Every rank's array combined once, over the ranks' own arrays (no copy per receiver);
    # the op is matched across ranks like the call itself.
    out = g.combine_arrays(_array(h), _reduce_parts, (_op(op),), tag=_tag("all_reduce"))
    _store(h, out)
    return _Done() if async_op else None


def all_gather(r: HostedRank, tensor_list: list, tensor: Any, group: Any = None,
               async_op: bool = False) -> Any:
    g = _group(r, group)
    pg = _over_nccl(r, g, tensor, "all_gather")
    if pg is not None:
        pg_nccl.all_gather(r, pg, _share(g, _tag("all_gather")), tensor_list, tensor)
        return _Done() if async_op else None
    h = _host(tensor, "all_gather")
    if len(tensor_list) != g.size:
        raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} entries, the group "
                         f"has {g.size} ranks")
    parts = g.combine_arrays(_array(h), _stack, tag=_tag("all_gather"))
    for dst, a in zip(tensor_list, parts):
        _store(_host(dst, "all_gather"), a)
    return _Done() if async_op else None


def all_gather_into_tensor(r: HostedRank, output_tensor: Any, input_tensor: Any,
                           group: Any = None, async_op: bool = False) -> Any:
    h, out = _host(input_tensor, "all_gather_into_tensor"), _host(output_tensor, "all_gather_into_tensor")
    g = _group(r, group)
    if out.numel() != g.size * h.numel():
        # ProcessGroupNCCL::_allgather_base's check
        raise ValueError("output tensor size must be equal to world_size times input tensor size")
    pg = _over_nccl(r, g, input_tensor, "all_gather_into_tensor")
    if pg is not None:
        pg_nccl.all_gather_into_tensor(r, pg, _share(g, _tag("all_gather_into_tensor")),
                                       output_tensor, input_tensor)
        return _Done() if async_op else None
    parts = g.combine_arrays(_array(h), _stack, tag=_tag("all_gather_into_tensor"))
    _store(out, parts)
    return _Done() if async_op else None


def reduce_scatter_tensor(r: HostedRank, output: Any, input: Any, op: Any = None,
                          group: Any = None, async_op: bool = False) -> Any:
    h, out = _host(input, "reduce_scatter_tensor"), _host(output, "reduce_scatter_tensor")
    g = _group(r, group)
    if h.numel() != g.size * out.numel():
        # ProcessGroupNCCL::_reduce_scatter_base's check
        raise ValueError("input tensor must be the same size as output size times world size")
    pg = _over_nccl(r, g, input, "reduce_scatter_tensor")
    if pg is not None:
        pg_nccl.reduce_scatter_tensor(r, pg, _share(g, _tag("reduce_scatter_tensor")), output,
                                      input, op)
        return _Done() if async_op else None
    full = g.combine_arrays(_array(h), _reduce_parts, (_op(op),), tag=_tag("reduce_scatter_tensor"))
    _store(out, full.reshape(g.size, -1)[g.rank])
    return _Done() if async_op else None


def broadcast(r: HostedRank, tensor: Any, src: Any = None, group: Any = None,
              async_op: bool = False, group_src: Any = None) -> Any:
    g = _group(r, group)
    s = _group_src(g, src, group_src)
    pg = _over_nccl(r, g, tensor, "broadcast")
    if pg is not None:
        pg_nccl.broadcast(r, pg, _share(g, _tag("broadcast")), tensor, s)
        return _Done() if async_op else None
    h = _host(tensor, "broadcast")
    got = g.broadcast_object(_array(h).copy() if g.rank == s else None, s,
                             tag=_tag("broadcast"))
    if g.rank != s:
        _store(h, got)
    return _Done() if async_op else None


SERVED = {f.__name__: f for f in (
    init_process_group, is_initialized, destroy_process_group, get_rank, get_world_size,
    get_backend, new_group, get_process_group_ranks, get_global_rank, get_group_rank,
    all_gather_object, broadcast_object_list, gather_object, barrier, all_reduce, all_gather,
    broadcast, all_gather_into_tensor, reduce_scatter_tensor)}


def _served(name: str, impl: Any) -> Callable[[Any], Any]:
    """The wrapper of torch.distributed.`name`: impl(rank, ...) in an inproc rank."""
    return lambda real: per_rank(name, impl, real, _inproc, with_rank=True)


def _refused(name: str) -> Callable[[Any], Any]:
    """The wrapper of a torch.distributed function inproc ranks cannot run."""
    stand_in = not_simulated(f"torch.distributed.{name}",
                             "in inproc mode (run with --mode procs for real gloo)")
    return lambda real: per_rank(name, stand_in, real, _inproc)


def _get_default_group(r: HostedRank) -> Any:
    """distributed_c10d._get_default_group(), which serving stacks call for the world group."""
    _world(r)
    return _st(r).world_handle


# torch's `GroupMember.WORLD` and `group.WORLD` are a property of their metaclass reading the
# one default group of the interpreter; inproc ranks share the interpreter, so the property
# answers each rank with its own world handle (None before init_process_group, as torch's).
def _patch_world(patches: Patches, dist: Any) -> None:
    import torch.distributed.distributed_c10d as c10d      # loaded with torch.distributed
    meta = c10d._WorldMeta
    real = meta.__dict__.get("WORLD")
    if real is None:
        return

    def world(cls: Any) -> Any:
        r = _inproc()
        return real.fget(cls) if r is None else _st(r).world_handle
    patches.attr(meta, "WORLD", property(world, real.fset))


register_surface("torch.distributed WORLD (inproc)",
                 lambda patches: patches.on_import("torch.distributed",
                                                   lambda dist: _patch_world(patches, dist)))


wrap_torch_distributed(
    "torch.distributed (inproc)",
    {"_get_default_group": _served("_get_default_group", _get_default_group),
     **{name: _served(name, impl) for name, impl in SERVED.items()},
     **{name: _refused(name) for name in NOT_SIMULATED if name not in SERVED}})
