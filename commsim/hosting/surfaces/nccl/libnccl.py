"""A libnccl that ctypes wrappers load, served per rank: vLLM's pynccl and its copies.

vLLM's `pynccl_wrapper.NCCLLibrary` (and SGLang's copy) picks `libnccl.so.2` when
`torch.version.cuda` is set, opens it with `ctypes.CDLL`, declares restype/argtypes for
ncclGetErrorString, ncclGetVersion, ncclGetUniqueId, ncclCommInitRank (the 128-byte
`ncclUniqueId` passed by value), ncclAllReduce, ncclAllGather, ncclReduceScatter,
ncclBroadcast, ncclSend, ncclRecv, ncclGroupStart/End, ncclCommDestroy and, on newer
versions, ncclCommWindowRegister/Deregister and ncclMemAlloc/Free; buffers are device
pointers (`data_ptr()`), the stream a `cudaStream_t` (`current_stream().cuda_stream`), and
every non-zero result goes through ncclGetErrorString into `RuntimeError("NCCL error: ...")`.

`ctypes.CDLL` of a name starting `libnccl.so` returns this library in a hosted rank
(fakelib.py; nothing is mapped: wrappers load NCCL by soname or an env path, not through
/proc/self/maps). Its functions are the C ABI over the communicators of nccl/comm.py.

Rules, with their sources (nccl.h and NCCL's docs; src/ paths are NCCL's source tree):
- Result codes and ncclGetErrorString texts: nccl.h / src/init.cc; an unknown code is
  "unknown result code".
- A NULL out-pointer (ncclGetVersion, ncclGetUniqueId, ncclCommInitRank's comm,
  ncclCommCount ...) is ncclInvalidArgument (PtrCheck, src/misc/argcheck.cc).
- ncclCommInitRank: `nranks < 1` or `rank` outside 0..nranks-1 is ncclInvalidArgument
  ("Invalid rank requested", src/init.cc); then the rendezvous and the machine's init rules
  (nccl/comm.py). Called inside ncclGroupStart/End, a blocking init still completes at the
  call here (NCCL defers it to ncclGroupEnd: UNCONFIRMED whether a program can tell).
- Every operation checks its comm (CommCheck: NULL or not a live communicator:
  ncclInvalidArgument), its root or peer (0..nranks-1), datatype (< ncclNumTypes) and
  reduction op (< ncclNumOps: user-defined ops are not simulated) before anything else
  (ArgsCheck, src/enqueue.cc / argcheck.cc): ncclInvalidArgument.
- A buffer that is not mapped device memory of this process faults in the kernel on a GPU
  (cudaErrorIllegalAddress); NCCL reports it as ncclUnhandledCudaError (UNCONFIRMED: with
  NCCL_CHECK_POINTERS=1 it would be ncclInvalidArgument at the call; the default is 0).
  The CUDA error is recorded on the rank's events with the call site. NULL buffers with a
  count of 0 are fine (nothing is read).
- ncclGroupStart/End nest; operations issued inside run at the outermost ncclGroupEnd, every
  send before every receive and collective (NCCL fuses the group, so a send/recv exchange
  between two ranks inside one group cannot deadlock). ncclGroupEnd without a start is
  ncclInvalidUsage (src/group.cc "ncclGroupEnd: not in a group call"). Outside a group a
  send is buffered and returns (a real NCCL's send waits on the GPU for the matching
  receive, so two ranks that both send first deadlock there: not modelled).
- ncclCommDestroy(NULL) is ncclSuccess (src/init.cc returns early); destroying is local.
- ncclMemAlloc/ncclMemFree: device memory of the rank's current device (a cudaMalloc here;
  NCCL uses cuMem VMM allocations: UNCONFIRMED whether a program can tell, except through
  legacy IPC, which cuMem memory refuses); freeing a pointer ncclMemAlloc did not return is
  ncclInvalidArgument (UNCONFIRMED).
- ncclCommWindowRegister (NCCL 2.27) is collective: every rank takes part; windows and
  ncclCommRegister handles are bookkeeping (no data path of their own here).

Work completes at the call (as every simulated stream operation). Inside a CUDA graph
capture made with `torch.cuda.graph` on the same device, an operation on the capture stream
is recorded in the graph instead of running, and runs at each `replay()` (torch/graphs.py),
as NCCL kernels captured on a GPU do; the peers must replay their graphs too.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import numpy as np

from commsim.libmodels.nccl.datapath import exchange
from commsim.libmodels.nccl.errors import NcclError
from commsim.sim.driver_calls import Fail
from commsim.hosting.install import fakelib
from commsim.hosting.surfaces.nccl import comm as nc
from commsim.hosting.install.dispatch import not_simulated
from commsim.hosting.surfaces.nccl.comm import (DTYPES, INVALID_ARGUMENT, INVALID_USAGE, NUM_OPS, NUM_TYPES, OPS,
                        SUCCESS, UNHANDLED_CUDA, Comm, NcclFailure, RankNccl)
from commsim.hosting.install.patches import Patches
from commsim.hosting.state.session import current, user_site
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import hosted
from commsim.hosting.surfaces.torch.graphs import capture_on
from commsim.hosting.surfaces.cuda import runtime_api as rt

SONAME = "libnccl.so.2"
# ncclGetVersion: the run's NCCL (commsim/versions.py), by default 2.29.7 (NCCL_VERSION(2,29,7) = 2*10000 + 29*100 + 7, nccl.h): vLLM 0.33.0's
# pynccl requires ncclCommSuspend / ncclCommResume on CUDA ("NCCL >= 2.29.7 does",
# vllm/distributed/device_communicators/pynccl_wrapper.py) and disables itself without them;
# 2.27 is the first with ncclCommWindowRegister. Which NCCL a given wheel ships: UNCONFIRMED.
VERSION = 22907

ERROR_STRINGS = {
    0: b"no error",
    1: b"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    2: b"unhandled system error (run with NCCL_DEBUG=INFO for details)",
    3: b"internal error - please report this issue to the NCCL developers",
    4: b"invalid argument (run with NCCL_DEBUG=WARN for details)",
    5: b"invalid usage (run with NCCL_DEBUG=WARN for details)",
    6: b"remote process exited or there was a network error",
    7: b"NCCL operation in progress",
}

# The functions NCCL 2.29 exports (nccl.h) that callers look up; the ones below without an
# implementation exist and fail loudly when called, naming themselves. Not exported here:
# ncclCommQueryProperties (2.29; vLLM treats it as optional), UNCONFIRMED which others.
_SYMBOLS = frozenset("""
    ncclMemAlloc ncclMemFree ncclGetVersion ncclGetUniqueId ncclCommInitRankConfig
    ncclCommInitRank ncclCommInitAll ncclCommInitRankScalable ncclCommFinalize
    ncclCommDestroy ncclCommAbort ncclCommSplit ncclCommShrink ncclGetErrorString
    ncclGetLastError ncclCommGetAsyncError ncclCommCount ncclCommCuDevice ncclCommUserRank
    ncclCommRegister ncclCommDeregister ncclCommWindowRegister ncclCommWindowDeregister
    ncclRedOpCreatePreMulSum ncclRedOpDestroy ncclReduce ncclBcast ncclBroadcast
    ncclAllReduce ncclReduceScatter ncclAllGather ncclSend ncclRecv ncclGroupStart
    ncclGroupEnd ncclGroupSimulateEnd ncclCommSuspend ncclCommResume""".split())

_P, _I = ctypes.c_void_p, ctypes.c_int


def _rank_state() -> tuple[Any, RankNccl]:
    r = current()
    return r, nc.state(r)


def _failed(api: str, e: NcclFailure) -> int:
    """Record a failure as NCCL's WARN would show it, for the verdict; give back the code."""
    r, st = _rank_state()
    st.last_error = str(e)
    r.events.note(f"libnccl: {api} -> {nc.RESULT_NAMES.get(e.code, e.code)}: {e} "
                  f"at {user_site(3)}")
    return e.code


def _c_api(name: str) -> Callable[[Callable[..., None]], Callable[..., int]]:
    """An implementation that raises NcclFailure becomes a function returning its code."""
    def wrap(fn: Callable[..., None]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            try:
                fn(*args)
            except NcclFailure as e:
                return _failed(name, e)
            return SUCCESS
        call.__name__ = name
        return call
    return wrap


def _ptr_check(addr: int, api: str, what: str) -> None:
    if not addr:
        raise NcclFailure(INVALID_ARGUMENT, f"{api} : {what} argument is NULL")


def _put(addr: int, ctype: Any, value: int) -> None:
    ctype.from_address(addr).value = value


# ---- operations ------------------------------------------------------------------------------

def _view(r: Any, ptr: int, nbytes: int, api: str, what: str) -> np.ndarray:
    """The live bytes of a device buffer, or the kernel's fault as NCCL reports it."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    try:
        return r.driver.view(ptr, nbytes)
    except Fail:                 # unmapped, no access, freed: the kernel's fault (code 700)
        r.events.cuda_error(api, 700, "cudaErrorIllegalAddress",
                            f"an illegal memory access was encountered ({what} {hex(ptr)}, "
                            f"{nbytes} bytes)")
        raise NcclFailure(UNHANDLED_CUDA, f"{api} : {what} {hex(ptr)} is not device memory "
                                          f"of this process ({nbytes} bytes)") from None


def _typed(a: np.ndarray, dt: int) -> np.ndarray:
    return a.view(DTYPES[dt][1])


def _check(st: RankNccl, api: str, comm: int, dt: int, op: int = 0, root: int = 0,
           what: str = "root") -> Comm:
    c = nc.comm_of(st, comm, api)
    if not 0 <= root < c.nranks:
        raise NcclFailure(INVALID_ARGUMENT, f"{api} : invalid {what} {root} ({what} should be "
                                            f"in the 0..{c.nranks - 1} range)")
    if not 0 <= dt < NUM_TYPES:
        raise NcclFailure(INVALID_ARGUMENT, f"{api} : invalid type {dt}")
    if not 0 <= op < NUM_OPS:
        raise NcclFailure(INVALID_ARGUMENT, f"{api} : invalid reduction operation {op}"
                          + (" (user-defined reduction ops are not simulated)" if op >= NUM_OPS else ""))
    return c


def _begin(api: str, comm: int, dt: int, count: int, op: int | None = None, root: int = 0,
           what: str = "root") -> tuple[Any, Comm, int]:
    """The checks every operation makes at the call (op None: it does not reduce); (rank,
    comm, bytes of `count` elements)."""
    r, st = _rank_state()
    c = _check(st, api, comm, dt, op or 0, root, what)
    if op is not None and dt in nc._FP8:
        raise NotImplementedError(f"commsim hosting: libnccl {api} of {DTYPES[dt][0]} is not "
                                  f"simulated")
    return r, c, count * DTYPES[dt][2]


def _tag(api: str, c: Comm) -> str:
    return f"{api} on nccl comm rank {c.rank}/{c.nranks} at {user_site(4, 1)}"


Op = tuple[Comm, int, str, Callable[[], None]]     # (comm, stream, "send"|"recv"|"coll", run)


def _connected(c: Comm, run: Callable[[], None]) -> Callable[[], None]:
    """A collective that first sets up the communicator's connections where init left them
    to the first collective (NCCL_RUNTIME_CONNECT, libmodels/nccl/comm.py): a set-up
    failure is the collective's result, with NCCL's code and WARN."""
    def connected() -> None:
        try:
            c.nccl.connect()
            run()
        except NcclError as e:
            raise NcclFailure(e.code, e.warn) from None
    return connected


def _issue(api: str, c: Comm, stream: int, run: Callable[[], None], kind: str = "coll") -> None:
    """Run an operation now, defer it to the group's end, or record it in a graph capture."""
    if kind == "coll" and c.nccl is not None:
        run = _connected(c, run)
    _, st = _rank_state()
    if st.depth > 0:
        st.pending.append((c, stream, kind, run))
        return
    _launch([(c, stream, kind, run)], api)


def _in_order(ops: list[Op]) -> Callable[[], None]:
    # Sends first: they are buffered, so every receive and collective after them finds them.
    ordered = [f for _, _, k, f in ops if k == "send"] + [f for _, _, k, f in ops if k != "send"]

    def work() -> None:
        for f in ordered:
            f()
    return work


def _launch(ops: list[Op], api: str) -> None:
    """Operations on a capture stream go into the capture's graph, as NCCL's kernels do:
    nothing moves until the graph is replayed (a failure then raises out of replay(), where a
    GPU would fault inside the graph). The others run now."""
    now: list[Op] = []
    captured: dict[int, tuple[Any, list[Op]]] = {}
    for op in ops:
        cap = capture_on(op[0].device, op[1])
        if cap is None:
            now.append(op)
        else:
            captured.setdefault(id(cap), (cap, []))[1].append(op)
    for cap, mine in captured.values():
        work = _in_order(mine)
        cap.work.append(lambda work=work: _replayed(api, work))
    _in_order(now)()


def _replayed(api: str, work: Callable[[], None]) -> None:
    try:
        work()
    except NcclFailure as e:
        raise RuntimeError(f"commsim hosting: libnccl {api} replayed in a CUDA graph failed: "
                           f"{nc.RESULT_NAMES.get(e.code)}: {e}") from None


def _reduce_op(api: str, send: int, recv: int, count: int, dt: int, op: int, comm: int,
               stream: int, root: int | None) -> None:
    """ncclAllReduce (root None) and ncclReduce: the reduction of every rank's send buffer."""
    r, c, nbytes = _begin(api, comm, dt, count, op, 0 if root is None else root)

    def run() -> None:
        src = _typed(_view(r, send, nbytes, api, "sendbuff"), dt)
        out = _combined(c, src, api, nc.reduce_parts, (op, dt, count), dt)
        if root is None or c.rank == root:
            _view(r, recv, nbytes, api, "recvbuff")[...] = np.asarray(out).view(np.uint8)
    _issue(api, c, stream, run)


def _combined(c: Any, src: np.ndarray, api: str, combine: Callable[..., np.ndarray],
              args: tuple, dt: int | None = None) -> np.ndarray:
    """`combine(parts, *args)` over every rank's `src` in comm-rank order: on a communicator
    the simulated NCCL set up, the parts are the bytes as they arrived here over each pair's
    connection (datapath.py), so a machine that drops or garbles peer writes hangs or
    corrupts every collective, not only ncclAllReduce; else the group's exact combine. Which
    pairs carry bytes is the one-shot exchange's (every pair), not NCCL's ring or tree for
    the collective (UNCONFIRMED: a broadcast's chain may skip a pair)."""
    if c.nccl is None:
        return c.group.combine_arrays(src, combine, args, tag=_tag(api, c))
    parts = exchange(c.nccl, src.view(np.uint8), api)
    return combine([p if dt is None else _typed(p, dt) for p in parts], *args)


def _all_reduce(send: int, recv: int, count: int, dt: int, op: int, comm: int,
                stream: int) -> None:
    _reduce_op("ncclAllReduce", send, recv, count, dt, op, comm, stream, None)


def _reduce(send: int, recv: int, count: int, dt: int, op: int, root: int, comm: int,
            stream: int) -> None:
    _reduce_op("ncclReduce", send, recv, count, dt, op, comm, stream, ctypes.c_int(root).value)


def _reduce_scatter(send: int, recv: int, recvcount: int, dt: int, op: int, comm: int,
                    stream: int) -> None:
    api = "ncclReduceScatter"
    r, c, nbytes = _begin(api, comm, dt, recvcount, op)

    def run() -> None:
        src = _typed(_view(r, send, nbytes * c.nranks, api, "sendbuff"), dt)
        out = _combined(c, src, api, nc.reduce_parts, (op, dt, recvcount * c.nranks), dt)
        mine = np.asarray(out).view(np.uint8)[c.rank * nbytes:(c.rank + 1) * nbytes]
        _view(r, recv, nbytes, api, "recvbuff")[...] = mine
    _issue(api, c, stream, run)


def _all_gather(send: int, recv: int, sendcount: int, dt: int, comm: int, stream: int) -> None:
    api = "ncclAllGather"
    r, c, nbytes = _begin(api, comm, dt, sendcount)

    def run() -> None:
        src = _view(r, send, nbytes, api, "sendbuff")
        out = _combined(c, src, api, nc.concat_parts, (nbytes,))
        _view(r, recv, nbytes * c.nranks, api, "recvbuff")[...] = out
    _issue(api, c, stream, run)


def _broadcast(send: int, recv: int, count: int, dt: int, root: int, comm: int,
               stream: int) -> None:
    api = "ncclBroadcast"
    root = ctypes.c_int(root).value
    r, c, nbytes = _begin(api, comm, dt, count, None, root)

    def run() -> None:
        # sendbuff is read on the root only (NCCL docs, ncclBroadcast)
        if c.rank == root:
            src = _view(r, send, nbytes, api, "sendbuff")
        else:
            # Over NCCL's connections every rank moves as many bytes as the root (datapath.py
            # exchanges equal parts); the group combine needs none from a non-root.
            src = np.zeros(nbytes if c.nccl is not None else 0, np.uint8)
        out = _combined(c, src, api, nc.pick_part, (root, nbytes))
        dst = _view(r, recv, nbytes, api, "recvbuff")
        if c.rank != root or recv != send:
            dst[...] = out
    _issue(api, c, stream, run)


def _bcast(buff: int, count: int, dt: int, root: int, comm: int, stream: int) -> None:
    """ncclBcast: the in-place legacy form of ncclBroadcast (nccl.h)."""
    _broadcast(buff, buff, count, dt, root, comm, stream)


def _send(send: int, count: int, dt: int, peer: int, comm: int, stream: int) -> None:
    api = "ncclSend"
    peer = ctypes.c_int(peer).value
    r, c, nbytes = _begin(api, comm, dt, count, None, peer, "peer")

    def run() -> None:
        data = bytes(_view(r, send, nbytes, api, "sendbuff"))
        c.transport.send(c.ctx, c.rank, peer, 0, data)
    _issue(api, c, stream, run, "send")


def _recv(recv: int, count: int, dt: int, peer: int, comm: int, stream: int) -> None:
    api = "ncclRecv"
    peer = ctypes.c_int(peer).value
    r, c, nbytes = _begin(api, comm, dt, count, None, peer, "peer")

    def run() -> None:
        dst = _view(r, recv, nbytes, api, "recvbuff")
        _, _, data = c.transport.recv(c.ctx, c.rank, [peer], 0,
                                      f"{api} from comm rank {peer} at {user_site(4, 1)}",
                                      c.members)
        if len(data) != nbytes:
            # A size mismatch between a send and its receive is a programming error; NCCL
            # truncates or hangs depending on the protocol (UNCONFIRMED): refused here.
            raise NcclFailure(INVALID_USAGE, f"{api} : expected {nbytes} bytes from rank "
                                             f"{peer}, which sent {len(data)}")
        dst[...] = np.frombuffer(data, np.uint8)
    _issue(api, c, stream, run, "recv")


def _group_start() -> None:
    _, st = _rank_state()
    st.depth += 1


def _group_end() -> None:
    _, st = _rank_state()
    if st.depth == 0:
        raise NcclFailure(INVALID_USAGE, "ncclGroupEnd: not in a group call")
    st.depth -= 1
    if st.depth:
        return
    pending, st.pending = st.pending, []
    _launch(pending, "ncclGroupEnd")


# ---- communicators ---------------------------------------------------------------------------

def _get_version(out: int) -> None:
    _ptr_check(out, "ncclGetVersion", "version")
    r = hosted()
    _put(out, _I, VERSION if r is None else nc.run_version(r))


def _get_unique_id(out: int) -> None:
    _ptr_check(out, "ncclGetUniqueId", "out")
    ctypes.memmove(out, nc.unique_id(current()), nc.ID_BYTES)


def _comm_init_rank(out: int, nranks: int, unique: Any, rank: int) -> None:
    api = "ncclCommInitRank"
    _ptr_check(out, api, "newcomm")
    nranks, rank = ctypes.c_int(nranks).value, ctypes.c_int(rank).value
    if nranks < 1 or not 0 <= rank < nranks:
        raise NcclFailure(INVALID_ARGUMENT, f"{api} : Invalid rank requested : {rank}/{nranks}")
    blob = unique if isinstance(unique, bytes) else ctypes.string_at(unique, nc.ID_BYTES)
    r, st = _rank_state()
    site = user_site(3, 1)
    err, device = rt.cudaGetDevice()
    if int(err) != 0:
        raise NcclFailure(UNHANDLED_CUDA, f"{api} : cudaGetDevice failed ({int(err)})")
    m = nc.rendezvous(r, st, blob[:nc.ID_BYTES], nranks, rank, site)
    nccl = nc.init_nccl(r, m.group, rank, nranks, key=f"{blob[:nc.ID_BYTES].hex()}/{m.ctx}")
    handle = nc.new_handle(st)
    st.comms[handle] = Comm(handle, nranks, rank, int(device), m.group, m.transport, m.ctx,
                            m.members, nccl=nccl)
    _put(out, _P, handle)


def _comm_destroy(comm: int) -> None:
    if not comm:
        return                           # src/init.cc: a NULL comm is a no-op
    _, st = _rank_state()
    c = nc.comm_of(st, comm, "ncclCommDestroy")
    c.alive = False
    if c.nccl is not None:
        c.nccl.close()
    del st.comms[comm]


def _comm_finalize(comm: int) -> None:
    _, st = _rank_state()
    nc.comm_of(st, comm, "ncclCommFinalize")      # work completes at launch: nothing to flush


def _comm_query(api: str, attr: str) -> Callable[[int, int], None]:
    def query(comm: int, out: int) -> None:
        _, st = _rank_state()
        c = nc.comm_of(st, comm, api)
        _ptr_check(out, api, attr)
        _put(out, _I, getattr(c, attr))
    return query


def _async_error(comm: int, out: int) -> None:
    _, st = _rank_state()
    nc.comm_of(st, comm, "ncclCommGetAsyncError")
    _ptr_check(out, "ncclCommGetAsyncError", "asyncError")
    _put(out, _I, SUCCESS)      # errors are returned by the calls themselves here


def _last_error(comm: int) -> bytes:
    _, st = _rank_state()
    return st.last_error.encode()


# ---- memory, windows, registration --------------------------------------------------------------

def _mem_alloc(out: int, size: int) -> None:
    _ptr_check(out, "ncclMemAlloc", "ptr")
    err, ptr = rt.cudaMalloc(size)
    if int(err) != 0:
        raise NcclFailure(UNHANDLED_CUDA, f"ncclMemAlloc : cuMem allocation of {size} bytes "
                                          f"failed ({int(err)})")
    _, st = _rank_state()
    st.mem.add(int(ptr))
    _put(out, _P, int(ptr))


def _mem_free(ptr: int) -> None:
    _, st = _rank_state()
    if ptr not in st.mem:
        raise NcclFailure(INVALID_ARGUMENT, f"ncclMemFree : {hex(ptr)} was not allocated by "
                                            f"ncclMemAlloc")
    st.mem.discard(ptr)
    rt.cudaFree(ptr)


def _registrar(api: str, table: str, collective: bool) -> Callable[..., None]:
    """ncclCommWindowRegister (collective: every rank takes part, NCCL docs "Window
    Registration") and ncclCommRegister (local): the buffer must be mapped device memory;
    the handle is bookkeeping kept on the comm's `table`."""
    def register(comm: int, buff: int, size: int, out: int, *flags: int) -> None:
        r, st = _rank_state()
        c = nc.comm_of(st, comm, api)
        _ptr_check(out, api, "handle")
        _view(r, buff, size, api, "buff")
        if collective:
            c.group.barrier(tag=_tag(api, c))
        handle = nc.new_handle(st)
        getattr(c, table)[handle] = (buff, size)
        _put(out, _P, handle)
    return register


def _deregistrar(api: str, table: str) -> Callable[[int, int], None]:
    def deregister(comm: int, handle: int) -> None:
        _, st = _rank_state()
        c = nc.comm_of(st, comm, api)
        if getattr(c, table).pop(handle, None) is None:
            raise NcclFailure(INVALID_ARGUMENT, f"{api} : {hex(handle)} is not registered "
                                                f"with this comm")
    return deregister


def _functions() -> dict[str, Callable[..., Any]]:
    coded = {
        "ncclGetVersion": _get_version, "ncclGetUniqueId": _get_unique_id,
        "ncclCommInitRank": _comm_init_rank, "ncclCommDestroy": _comm_destroy,
        "ncclCommAbort": _comm_destroy, "ncclCommFinalize": _comm_finalize,
        "ncclCommCount": _comm_query("ncclCommCount", "nranks"),
        "ncclCommUserRank": _comm_query("ncclCommUserRank", "rank"),
        "ncclCommCuDevice": _comm_query("ncclCommCuDevice", "device"),
        "ncclCommGetAsyncError": _async_error,
        "ncclAllReduce": _all_reduce, "ncclReduce": _reduce, "ncclReduceScatter": _reduce_scatter,
        "ncclAllGather": _all_gather, "ncclBroadcast": _broadcast, "ncclBcast": _bcast,
        "ncclSend": _send, "ncclRecv": _recv, "ncclGroupStart": _group_start,
        "ncclGroupEnd": _group_end, "ncclMemAlloc": _mem_alloc, "ncclMemFree": _mem_free,
        "ncclCommWindowRegister": _registrar("ncclCommWindowRegister", "windows", True),
        "ncclCommWindowDeregister": _deregistrar("ncclCommWindowDeregister", "windows"),
        "ncclCommRegister": _registrar("ncclCommRegister", "registered", False),
        "ncclCommDeregister": _deregistrar("ncclCommDeregister", "registered"),
    }
    out: dict[str, Callable[..., Any]] = {n: _c_api(n)(f) for n, f in coded.items()}
    out["ncclGetErrorString"] = lambda code: ERROR_STRINGS.get(ctypes.c_int(code).value,
                                                               b"unknown result code")
    out["ncclGetLastError"] = _last_error
    return out


_FUNCTIONS = _functions()
SIMULATED = tuple(sorted(_FUNCTIONS))


def call(name: str, *args: Any) -> Any:
    """The C function `name` as a caller inside the rank's process makes it (torch's
    ProcessGroupNCCL links libnccl; torch_distributed/pg_nccl.py calls it here)."""
    return _FUNCTIONS[name](*args)


def last_error() -> str:
    """ncclGetLastError(NULL) of the running rank."""
    return _last_error(0).decode()


def library(name: str) -> fakelib.FakeLibrary:
    return fakelib.FakeLibrary(name, _FUNCTIONS, lambda s: s in _SYMBOLS or s in _FUNCTIONS,
                               lambda s: not_simulated(f"libnccl.{s}"))


def _patch(patches: Patches) -> None:
    fakelib.serve(patches, "libnccl.so", library, hosted)


SURFACE = register_surface("libnccl", _patch)
install, uninstall = SURFACE.install, SURFACE.uninstall

__all__ = ["SONAME", "VERSION", "ERROR_STRINGS", "library", "install", "uninstall", "OPS", "call", "last_error"]
