"""ProcessGroupNCCL of a hosted rank: torch.distributed's "nccl" backend over the rank's
simulated NCCL (rules NC18-NC22 of docs/lifecycle-rules.md), through the same C calls the ctypes libnccl surface serves (nccl/libnccl.py),
so every machine fault that reaches NCCL reaches a torch.distributed "nccl" program too.

Sources: torch/csrc/distributed/c10d/ProcessGroupNCCL.{hpp,cpp}, NCCLUtils.{hpp,cpp} (the
pytorch/pytorch snapshot the search tool holds; that v2.13.0 has the same texts is
UNCONFIRMED: the repository was too large to fetch at that tag).
- A group's communicator is made at its first collective on a CUDA tensor (getNCCLComm):
  group rank 0 calls ncclGetUniqueId, the id goes to the others through the group's store,
  each calls ncclCommInitRank on the tensor's device. `device_id` passed to
  init_process_group / new_group makes it at that call instead (eager init).
- A failing NCCL call raises torch.distributed.DistBackendError with C10D_NCCL_CHECK's text:
  "NCCL error in: <file>:<line>, <ncclGetErrorString>, NCCL version X.Y.Z\\n" then
  getNcclErrorDetailStr: "<result name>: <interpretation>\\nLast error:\\n<ncclGetLastError>".
  The file and line are those of a torch 2.8 report (aws-samples/llm_model_hub#115:
  ProcessGroupNCCL.cpp:3699); the line of a 2.13 build is UNCONFIRMED.
- A collective that never completes is what the watchdog names: "[Rank R] Watchdog caught
  collective operation timeout: WorkNCCL(SeqNum=N, OpType=ALLREDUCE, NumelIn=.., NumelOut=..,
  Timeout(ms)=..) ran for .. milliseconds before timing out." (the watchdog's exceptionMsg
  in ProcessGroupNCCL.cpp; SeqNum counts the group's collectives from 1). What
  follows depends on TORCH_NCCL_ASYNC_ERROR_HANDLING (ProcessGroupNCCL.hpp: 0 no handling,
  1 tear down, 2 clean up only, 3 skip clean up, the default): 1 and 3 take the process down,
  2 aborts the communicators, 0 leaves the collective hanging. The simulated outcome is a
  diagnosed hang in every case, its text naming the watchdog and what the mode does.
- barrier() is an all-reduce of one element on the group's device (profiling name
  "nccl:all_reduce_barrier"; which OpType the watchdog prints for it: UNCONFIRMED, ALLREDUCE
  here).
- Element types and reduction ops map as getNcclDataType / getNcclReduceOp do (bool as
  ncclUint8, its SUM as ncclMax and PRODUCT as ncclMin); BAND/BOR/BXOR are refused with
  torch's "Cannot use ReduceOp.<op> with NCCL".
"""

from __future__ import annotations

import ctypes
import os
import pickle
from dataclasses import dataclass
from typing import Any, Callable

import torch

from commsim.hosting.state.session import HostedRank, bound
from commsim.hosting.surfaces.nccl import comm as nc
from commsim.hosting.surfaces.nccl import libnccl
from commsim.hosting.surfaces.torch.memory import before_exit
from commsim.runtime.diagnosis import HangDetected

# Where C10D_NCCL_CHECK raises (see the module's note: the line is UNCONFIRMED for 2.13).
CHECK_SITE = "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3699"

# getNcclErrorDetailStr (NCCLUtils.cpp): result name and torch's interpretation.
DETAILS = {
    nc.UNHANDLED_CUDA: "ncclUnhandledCudaError: Call to CUDA function failed.",
    nc.SYSTEM: "ncclSystemError: System call (e.g. socket, malloc) or external library call "
               "failed or device error. ",
    nc.INTERNAL: "ncclInternalError: Internal check failed.",
    nc.INVALID_ARGUMENT: "ncclInvalidArgument: Invalid value for an argument.",
    nc.INVALID_USAGE: "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
    nc.REMOTE: "ncclRemoteError: A call failed possibly due to a network error or a remote "
               "process exiting prematurely.",
}

# getNcclDataType (ProcessGroupNCCL.cpp): torch dtype -> ncclDataType_t.
DTYPES = {torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4, torch.float16: 6,
          torch.float32: 7, torch.float64: 8, torch.bool: 1, torch.bfloat16: 9}

# The default collective timeout of an NCCL group (torch/distributed/constants.py:
# default_pg_nccl_timeout, 10 minutes).
DEFAULT_TIMEOUT_MS = 600_000

# TORCH_NCCL_ASYNC_ERROR_HANDLING (ProcessGroupNCCL.hpp ErrorHandlingMode) -> what the
# watchdog does after a timeout; 3 (SkipCleanUp) is the default.
ASYNC_HANDLING = {
    "0": "no handling (TORCH_NCCL_ASYNC_ERROR_HANDLING=0): the collective stays incomplete",
    "1": "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (TearDown): the communicators are aborted and the "
         "process is taken down",
    "2": "TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (CleanUpOnly): the communicators are aborted, the "
         "process goes on",
    "3": "TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (SkipCleanUp): the process is taken down without "
         "aborting the communicators",
}


def uses_nccl(backend: str, device_type: str) -> bool:
    """Whether a group made with `backend` runs a collective on a `device_type` tensor over
    NCCL: "nccl" binds CUDA, "cpu:gloo,cuda:nccl" binds CUDA only (torch's BackendConfig)."""
    text = backend.lower()
    if device_type != "cuda":
        return False
    if ":" not in text:
        return text == "nccl"
    return any(part.strip() == "cuda:nccl" for part in text.split(","))


def barrier_uses_nccl(backend: str) -> bool:
    """barrier() goes over NCCL on a group whose only backend is NCCL; with a CPU backend
    beside it, over that one (UNCONFIRMED which one torch 2.13 picks for a mixed group).
    Object collectives follow the same rule (torch 2.13.0 distributed_c10d.py
    `_get_object_coll_device`: the one backend's device, or "cpu" when CPU is bound)."""
    return backend.lower() == "nccl"


def refuse_cpu(backend: str, t: Any) -> None:
    """A CPU tensor's collective on a group whose only backend is NCCL: ProcessGroup finds
    no backend for the CPU device and raises (torch 2.13.0 libtorch_cpu, ProcessGroup's
    getBackend: "No backend type associated with device type cpu")."""
    if backend.lower() == "nccl" and getattr(t, "device", None) is not None \
            and t.device.type == "cpu":
        raise RuntimeError("No backend type associated with device type cpu")


def timeout_ms(timeout: Any) -> int:
    """The group's collective timeout in ms (a timedelta, or None for NCCL's default)."""
    if timeout is None:
        return DEFAULT_TIMEOUT_MS
    return int(timeout.total_seconds() * 1000)


@dataclass
class GroupNccl:
    """ProcessGroupNCCL's state for one group of one rank."""

    rank: int                   # the rank in the group
    size: int
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    comm: int = 0               # the libnccl handle, once made
    device: int = -1            # the device the communicator was made on
    seq: int = 0                # SeqNum of the group's last collective

    def close(self) -> None:
        if self.comm:
            libnccl.call("ncclCommDestroy", self.comm)
            self.comm = 0


def _version(r: HostedRank) -> str:
    x, y, z = (tuple(r.driver.cluster.versions.nccl) + (0, 0, 0))[:3]
    return f"{x}.{y}.{z}"


def backend_error(r: HostedRank, code: int) -> Exception:
    """C10D_NCCL_CHECK's DistBackendError for an NCCL result `code` (NCCLUtils.hpp/.cpp)."""
    import torch.distributed as dist
    what = libnccl.ERROR_STRINGS.get(code, b"unknown result code").decode()
    text = (f"NCCL error in: {CHECK_SITE}, {what}, NCCL version {_version(r)}\n"
            f"{DETAILS.get(code, 'Unknown NCCL error!')}"
            f"\nLast error:\n{libnccl.last_error() or 'Unknown NCCL Error'}")
    return dist.DistBackendError(text)


def _check(r: HostedRank, code: int) -> None:
    if code != nc.SUCCESS:
        raise backend_error(r, code)


def connect(r: HostedRank, g: GroupNccl, device: int,
            share_id: Callable[[bytes | None], bytes]) -> int:
    """The group's communicator on `device`, made now if it is not yet (getNCCLComm):
    `share_id(blob)` gives group rank 0's unique id to every rank (rank 0 passes its own)."""
    if g.comm:
        return g.comm
    mine = None
    if g.rank == 0:
        buf = ctypes.create_string_buffer(nc.ID_BYTES)
        _check(r, libnccl.call("ncclGetUniqueId", ctypes.addressof(buf)))
        mine = buf.raw
    blob = share_id(mine)
    out = ctypes.c_void_p()
    with torch.cuda.device(device):
        _check(r, libnccl.call("ncclCommInitRank", ctypes.addressof(out), g.size, blob, g.rank))
    g.comm, g.device = int(out.value), device
    before_exit(r, lambda: _abort_at_exit(r, g))
    return g.comm


def split_color(ranks: list[int]) -> int:
    """The color torch splits a new group's communicator with (distributed_c10d.py
    `_process_group_color`: the hash of the group's global ranks, within C int)."""
    return abs(hash(tuple(ranks))) % 2 ** (ctypes.sizeof(ctypes.c_int) * 8 - 1)


def split(r: HostedRank, parent: GroupNccl, child: GroupNccl | None, ranks: list[int]) -> None:
    """new_group of a world whose communicator was made eagerly (device_id): the new group's
    communicator is split from the world's (torch 2.13.0 distributed_c10d.py
    `_new_process_group_helper`: split only once the default group has a bound device; the
    world's ranks outside the group make a NCCL_SPLIT_NOCOLOR split, "as otherwise we would
    get out of sync"), on the world's device. The key is the rank in the world
    (UNCONFIRMED: ProcessGroupNCCL's key; a group's ranks are sorted, so the order agrees)."""
    out = ctypes.c_void_p()
    color = split_color(ranks) if child is not None else libnccl.SPLIT_NOCOLOR
    _check(r, libnccl.call("ncclCommSplit", parent.comm, color, parent.rank,
                           ctypes.addressof(out), None))
    if child is not None:
        child.comm, child.device = int(out.value), parent.device
        before_exit(r, lambda: _abort_at_exit(r, child))


def _abort_at_exit(r: HostedRank, g: GroupNccl) -> None:
    """A group the program never destroyed: ProcessGroupNCCL's destructor aborts its
    communicators at the process's exit (its "process group has NOT been destroyed"
    warning), so what set-up made is released and the residue lists only the program's."""
    if g.comm:
        r.events.note("ProcessGroupNCCL: process group has NOT been destroyed before the "
                      "process exited; its NCCL communicator was aborted")
        with bound(r):
            g.close()


def _watchdog(g: GroupNccl, op_type: str, numel_in: int, numel_out: int) -> str:
    mode = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3").strip()
    return (f"[Rank {g.rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={g.seq}, OpType={op_type}, NumelIn={numel_in}, "
            f"NumelOut={numel_out}, Timeout(ms)={g.timeout_ms}) ran for {g.timeout_ms} "
            f"milliseconds before timing out; "
            f"{ASYNC_HANDLING.get(mode, ASYNC_HANDLING['3'])}")


def collective(r: HostedRank, g: GroupNccl, op_type: str, numel_in: int, numel_out: int,
               device: int, share_id: Callable[[bytes | None], bytes],
               call: Callable[[int], int]) -> None:
    """One collective of the group: the communicator (lazily), then `call(comm)` (an NCCL
    C call's result). A failure raises DistBackendError; a collective that cannot complete
    is a diagnosed hang named as the watchdog names it."""
    comm = connect(r, g, device, share_id)
    g.seq += 1
    try:
        code = call(comm)
    except HangDetected as e:
        raise type(e)(f"{_watchdog(g, op_type, numel_in, numel_out)}\n{e}",
                      getattr(e, "diagnosis", None)) from None
    _check(r, code)


def nccl_dtype(t: Any) -> int:
    if t.dtype not in DTYPES:
        raise TypeError(f"Unsupported data type for NCCL process group: {t.dtype}")
    return DTYPES[t.dtype]


def nccl_op(op: Any, t: Any) -> int:
    """getNcclReduceOp: torch's ReduceOp -> ncclRedOp_t."""
    import torch.distributed as dist
    R = dist.ReduceOp
    if op is None:
        op = R.SUM
    boolean = t.dtype == torch.bool
    table = {R.SUM: 2 if boolean else 0, R.PRODUCT: 3 if boolean else 1, R.MAX: 2, R.MIN: 3,
             R.AVG: 4}
    for k, v in table.items():
        if op == k:
            return v
    name = str(op).split(".")[-1]
    raise ValueError(f"Cannot use ReduceOp.{name} with NCCL")


class Completed:
    """The Work of an async_op=True call: the simulated collective completed at the call."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


Share = Callable[[bytes | None], bytes]


def _cuda(t: Any, what: str) -> int:
    """The tensor's device ordinal, after ProcessGroupNCCL's checks of a tensor argument."""
    if not t.is_contiguous():
        raise ValueError(f"{what}: Tensors must be contiguous")
    return int(t.device.index)


def all_reduce(r: HostedRank, g: GroupNccl, share: Share, t: Any, op: Any) -> None:
    dev, dt, red = _cuda(t, "all_reduce"), nccl_dtype(t), nccl_op(op, t)
    collective(r, g, "ALLREDUCE", t.numel(), t.numel(), dev, share,
               lambda comm: libnccl.call("ncclAllReduce", t.data_ptr(), t.data_ptr(),
                                         t.numel(), dt, red, comm, 0))


def broadcast(r: HostedRank, g: GroupNccl, share: Share, t: Any, root: int) -> None:
    dev, dt = _cuda(t, "broadcast"), nccl_dtype(t)
    collective(r, g, "BROADCAST", t.numel(), t.numel(), dev, share,
               lambda comm: libnccl.call("ncclBroadcast", t.data_ptr(), t.data_ptr(),
                                         t.numel(), dt, root, comm, 0))


def barrier(r: HostedRank, g: GroupNccl, share: Share) -> None:
    """An all-reduce of one element on the group's device: the one its communicator was
    made on (bound by device_id or used before), else guessDeviceId's guess, the group
    rank modulo the visible devices, with its warning (ProcessGroupNCCL.cpp)."""
    dev = g.device
    if dev < 0:
        dev = g.rank % torch.cuda.device_count()
        r.events.note(f"ProcessGroupNCCL: using GPU {dev} as device used by this process is "
                      f"currently unknown (barrier before any collective bound one)")
    one = torch.zeros(1, device=torch.device("cuda", dev))
    all_reduce(r, g, share, one, None)


def all_gather_into_tensor(r: HostedRank, g: GroupNccl, share: Share, out: Any, t: Any) -> None:
    dev, dt = _cuda(t, "all_gather_into_tensor"), nccl_dtype(t)
    _cuda(out, "all_gather_into_tensor")
    collective(r, g, "_ALLGATHER_BASE", t.numel(), out.numel(), dev, share,
               lambda comm: libnccl.call("ncclAllGather", t.data_ptr(), out.data_ptr(),
                                         t.numel(), dt, comm, 0))


def reduce_scatter_tensor(r: HostedRank, g: GroupNccl, share: Share, out: Any, t: Any,
                          op: Any) -> None:
    dev, dt, red = _cuda(t, "reduce_scatter_tensor"), nccl_dtype(t), nccl_op(op, t)
    _cuda(out, "reduce_scatter_tensor")
    collective(r, g, "_REDUCE_SCATTER_BASE", t.numel(), out.numel(), dev, share,
               lambda comm: libnccl.call("ncclReduceScatter", t.data_ptr(), out.data_ptr(),
                                         out.numel(), dt, red, comm, 0))


def all_gather(r: HostedRank, g: GroupNccl, share: Share, outs: list, t: Any) -> None:
    """all_gather into a list (ProcessGroupNCCL::allgather): outputs of one size are
    gathered into one flat buffer by ncclAllGather and copied out; outputs of different
    sizes take one ncclBroadcast per rank (the "uneven" path)."""
    if len(outs) != g.size:
        raise ValueError(f"all_gather: tensor_list has {len(outs)} entries, the group has "
                         f"{g.size} ranks")
    dev, dt, n = _cuda(t, "all_gather"), nccl_dtype(t), t.numel()
    if all(o.numel() == n for o in outs):
        flat = torch.empty(g.size * n, dtype=t.dtype, device=t.device)
        collective(r, g, "ALLGATHER", n, flat.numel(), dev, share,
                   lambda comm: libnccl.call("ncclAllGather", t.data_ptr(), flat.data_ptr(), n,
                                             dt, comm, 0))
        for i, o in enumerate(outs):
            o.copy_(flat[i * n:(i + 1) * n].view(o.shape))
        return
    outs[g.rank].copy_(t.view(outs[g.rank].shape))

    def each(comm: int) -> int:
        for i, o in enumerate(outs):
            code = libnccl.call("ncclBroadcast", o.data_ptr(), o.data_ptr(), o.numel(), dt, i,
                                comm, 0)
            if code:
                return code
        return 0
    collective(r, g, "ALLGATHER", n, sum(o.numel() for o in outs), dev, share, each)


def _to_bytes(obj: Any, device: Any) -> tuple[Any, Any]:
    """_object_to_tensor (distributed_c10d.py): the pickled object as a uint8 tensor on
    `device`, and its length as a one-element int64 tensor there."""
    data = pickle.dumps(obj)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    return t, torch.tensor([len(data)], dtype=torch.int64).to(device)


def _from_bytes(t: Any, size: int) -> Any:
    """_tensor_to_object: what a peer rank of this run pickled. The bytes arrive through
    simulated device memory only: this process's own (inproc ranks), or the run's segments,
    created exclusively 0600 under an unguessable prefix (procs ranks), so no other local user
    can have written them."""
    return pickle.loads(t.cpu().numpy().tobytes()[:size])


def all_gather_object(r: HostedRank, g: GroupNccl, share: Share, obj: Any) -> list:
    """all_gather_object on an NCCL group (torch 2.13.0 distributed_c10d.py): the object
    pickled into a CUDA tensor on the current device, the sizes all-gathered, then the
    bytes, padded to the largest, all-gathered: two ncclAllGather."""
    device = torch.device("cuda", torch.cuda.current_device())
    mine, size = _to_bytes(obj, device)
    sizes = torch.zeros(g.size, dtype=torch.int64, device=device)
    all_gather(r, g, share, [sizes[i:i + 1] for i in range(g.size)], size)
    counts = [int(v) for v in sizes.cpu().tolist()]
    longest = max(counts)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:mine.numel()].copy_(mine)
    out = torch.empty(longest * g.size, dtype=torch.uint8, device=device)
    all_gather(r, g, share, [out[i * longest:(i + 1) * longest] for i in range(g.size)], padded)
    return [_from_bytes(out[i * longest:(i + 1) * longest], counts[i]) for i in range(g.size)]


def broadcast_object_list(r: HostedRank, g: GroupNccl, share: Share, objs: list,
                          root: int) -> None:
    """broadcast_object_list on an NCCL group (distributed_c10d.py): the sizes, then the
    concatenated pickles, each one ncclBroadcast from group rank `root`; `objs` filled in
    place on the other ranks."""
    device = torch.device("cuda", torch.cuda.current_device())
    if g.rank == root:
        parts = [_to_bytes(o, device) for o in objs]
        sizes = torch.cat([s for _, s in parts])
        data = torch.cat([t for t, _ in parts])
    else:
        sizes = torch.empty(len(objs), dtype=torch.int64, device=device)
    broadcast(r, g, share, sizes, root)
    counts = [int(v) for v in sizes.cpu().tolist()]
    if g.rank != root:
        data = torch.empty(sum(counts), dtype=torch.uint8, device=device)
    broadcast(r, g, share, data, root)
    if g.rank != root:
        at = 0
        for i, n in enumerate(counts):
            objs[i] = _from_bytes(data[at:at + n], n)
            at += n


def default_backend() -> str:
    """What init_process_group(backend=None) binds: on a CUDA build CPU to gloo and CUDA to
    NCCL (torch/distributed/distributed_c10d.py, Backend.default_device_backend_map); the
    CPU build has no NCCL and takes gloo."""
    import torch.distributed as dist
    return "cpu:gloo,cuda:nccl" if dist.is_nccl_available() else "gloo"
