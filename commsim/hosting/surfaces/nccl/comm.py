"""NCCL communicators of a hosted rank: rendezvous, init rules, and the data they move.

The C surface (`nccl.py`) checks arguments and turns results into ncclResult_t codes; this
module is what a communicator is and does.

Rendezvous. NCCL's unique id names a bootstrap root that every rank of the communicator
contacts (ncclGetUniqueId / ncclCommInitRank, NCCL docs "Creating a communicator"); the
program carries the 128 bytes to its peers itself (vLLM broadcasts them over a
torch.distributed CPU group). Here:
- inproc (the ranks are greenlets of one LocalWorld): ranks check in under the id in a table
  kept per LocalWorld and wait with the scheduler's `wait_until` until `nranks` have, so a
  rank that never calls ncclCommInitRank is a diagnosed hang; the communicator is then a
  `LocalWorld.shared_group` of the world ranks in comm-rank order, and ncclSend/ncclRecv go
  through the same mailboxes as the mpi4py surface (wire.ranks.InprocTransport).
- procs (real processes): the process that calls ncclGetUniqueId hosts a key-value store on
  127.0.0.1 (kvstore.StoreServer, as NCCL's bootstrap root listens on a socket) and writes its
  port, a fresh 32-byte secret and the store's own secret (a connection proves it before the
  store serves it) into the id; every rank connects, and the communicator is
  commsim's sealed round protocol over that store (ProcessWorld / TorchDistGroup: values are
  HMAC-sealed with the id's secret, so a local stranger who does not hold the id can neither
  read a forged value into a rank nor join). Waits end at the run's timeout naming the ranks
  that never arrived. A peer that dies is not announced on this store (nobody marks it dead):
  its peers wait until the timeout.

Init. Once every rank has checked in, the simulated NCCL (commsim/libmodels/nccl/) runs
ncclCommInitRank's work through the rank's own driver: peer info and topology detection
over NVML and the driver, NCCL's search (the decision model of nccl_rules.py), the MNNVL
check, and connection set-up per peer with the driver calls NCCL makes for the pair's
transport (cuMem POSIX fd over the proxy socket, FABRIC, legacy IPC, /dev/shm segments),
then NVLS. A failing call is NCCL's code and WARN (ncclGetLastError). No automatic
NCCL_MNNVL_ENABLE=0 is applied (that is commsim's policy, not NCCL's): the program sees the
error a real NCCL gives it.

Data. ncclAllReduce, ncclReduce, ncclReduceScatter, ncclAllGather and ncclBroadcast move
every peer's bytes over the connection set-up made for the pair
(commsim/libmodels/nccl/datapath.py), so peer writes a machine loses hang them and garbled
ones give a wrong result. The collectives read and write the ranks' simulated device memory at the addresses the
program passes (the data_ptr() of hosted CUDA tensors, cudaMalloc/ncclMemAlloc pointers),
through the rank's driver (`driver.view`), and completes at the call, as every simulated
stream operation does. Reductions run once over all ranks' inputs in rank order: float16 and
bfloat16 sums in float32 rounded once (the project's reference reduction,
commsim/kernels/collectives.py), other types and ops with numpy in their own type. A real
NCCL's ring or tree orders the additions differently: low bits of a float sum may differ
(UNCONFIRMED how much for a given algorithm).
"""

from __future__ import annotations

import atexit
import hashlib
import functools
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from commsim.kernels.collectives import store_rounded
from commsim.libmodels.nccl.comm import NcclComm, init as nccl_init, version_code
from commsim.libmodels.nccl.errors import NcclError
from commsim.libmodels.nccl.proxy import process_transport
from commsim.libmodels.nccl.shm import DirShm, NamespaceShm
from commsim.runtime.scheduler import wait_until
from commsim.hosting.state.process_run import process_run
from commsim.hosting.state.session import HostedRank
from commsim.hosting.state.cuda_state import rank_state
from commsim.hosting.wire.ranks import InprocTransport
from commsim.group.torch_dist import ProcessWorld
from commsim.hosting.wire.kvstore import StoreClient
from commsim.hosting.wire.ranks import ProcsTransport
from commsim.hosting.wire.kvstore import StoreServer

# ncclResult_t (nccl.h)
SUCCESS, UNHANDLED_CUDA, SYSTEM, INTERNAL, INVALID_ARGUMENT, INVALID_USAGE, REMOTE, \
    IN_PROGRESS = range(8)
RESULT_CODES = {"ncclSuccess": SUCCESS, "ncclUnhandledCudaError": UNHANDLED_CUDA,
                "ncclSystemError": SYSTEM, "ncclInternalError": INTERNAL,
                "ncclInvalidArgument": INVALID_ARGUMENT, "ncclInvalidUsage": INVALID_USAGE,
                "ncclRemoteError": REMOTE, "ncclInProgress": IN_PROGRESS}
RESULT_NAMES = {v: k for k, v in RESULT_CODES.items()}

# ncclDataType_t (nccl.h; the two fp8 types since NCCL 2.24): code -> (name, numpy type,
# element size). bfloat16 travels as its raw 16 bits, fp8 as raw bytes.
DTYPES: dict[int, tuple[str, Any, int]] = {
    0: ("ncclInt8", np.int8, 1), 1: ("ncclUint8", np.uint8, 1), 2: ("ncclInt32", np.int32, 4),
    3: ("ncclUint32", np.uint32, 4), 4: ("ncclInt64", np.int64, 8),
    5: ("ncclUint64", np.uint64, 8), 6: ("ncclFloat16", np.float16, 2),
    7: ("ncclFloat32", np.float32, 4), 8: ("ncclFloat64", np.float64, 8),
    9: ("ncclBfloat16", np.uint16, 2), 10: ("ncclFloat8e4m3", np.uint8, 1),
    11: ("ncclFloat8e5m2", np.uint8, 1)}
NUM_TYPES = 12
# ncclRedOp_t (nccl.h): values from ncclNumOps up are user-defined ops (ncclRedOpCreate*).
OPS = {0: "ncclSum", 1: "ncclProd", 2: "ncclMax", 3: "ncclMin", 4: "ncclAvg"}
NUM_OPS = 5

_BF16, _FP8 = 9, (10, 11)


class NcclFailure(Exception):
    """A call's failure as an ncclResult_t code, with what NCCL would WARN."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# ---- per-rank state ----------------------------------------------------------------------

@dataclass(eq=False)
class Comm:
    handle: int
    nranks: int
    rank: int
    device: int                   # the CUDA ordinal current at init (ncclCommCuDevice)
    group: Any                    # commsim Group over the comm's ranks, in comm-rank order
    transport: Any                # point-to-point (wire.ranks.Transport)
    ctx: str                      # the transport's context name for this communicator
    members: tuple[int, ...]      # what the transport names peers by
    windows: dict[int, tuple[int, int]] = field(default_factory=dict)   # window -> (ptr, size)
    registered: dict[int, tuple[int, int]] = field(default_factory=dict)
    alive: bool = True
    nccl: NcclComm | None = None  # the simulated NCCL behind it: connections, log, data path


@dataclass
class RankNccl:
    comms: dict[int, Comm] = field(default_factory=dict)
    next_handle: int = 0x7e1000000000     # opaque pointer-like values, never dereferenced
    depth: int = 0                        # ncclGroupStart nesting
    pending: list[tuple[Comm, int, str, Callable[[], None]]] = field(default_factory=list)
    inits: dict[bytes, int] = field(default_factory=dict)   # id -> inits made with it
    mem: set[int] = field(default_factory=set)              # ncclMemAlloc pointers
    last_error: str = ""


def state(r: HostedRank) -> RankNccl:
    return rank_state(r, "libnccl", RankNccl)


def comm_of(st: RankNccl, handle: int, api: str) -> Comm:
    """CommCheck (NCCL src/misc/argcheck.cc): NULL is "comm argument is NULL", anything that
    is not a live communicator of this process "corrupted comm object detected"; both
    ncclInvalidArgument. A destroyed one is reused memory on a GPU host (undefined): here it
    is the same error."""
    if not handle:
        raise NcclFailure(INVALID_ARGUMENT, f"{api} : comm argument is NULL")
    c = st.comms.get(handle)
    if c is None or not c.alive:
        raise NcclFailure(INVALID_ARGUMENT, f"{api} : Error: corrupted comm object detected "
                                            f"({hex(handle)} is not a live communicator)")
    return c


def new_handle(st: RankNccl) -> int:
    st.next_handle += 0x1000
    return st.next_handle


# ---- unique ids and rendezvous -------------------------------------------------------------

ID_BYTES = 128
_MAGIC = b"CSNCCLID"      # marks an id made here; NCCL's own first 8 bytes are a random magic

_inproc_ids: "weakref.WeakKeyDictionary[Any, list[int]]" = weakref.WeakKeyDictionary()
_checkins: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


class _Root:
    """Procs mode: this process's bootstrap store (one per process, every id made here).

    Unlike NCCL's bootstrap root, this store carries the communicators' traffic after init
    too, so at exit the process keeps serving until every other rank has disconnected (its
    process ended) or the run's timeout passes: a rank that finishes its last collective
    first must not take the values its peers are still reading with it."""

    def __init__(self) -> None:
        self.secret = os.urandom(32)      # a client proves it to the store (kvstore.py)
        self.server = StoreServer(self.secret)
        self.port = self.server.port
        self.made = 0
        self.own: list[Any] = []          # this process's own clients of the store
        atexit.register(self.drain)

    def drain(self) -> None:
        for c in self.own:
            c.close()
        deadline = time.monotonic() + _timeout()
        while self.server.connections() > 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        self.server.close()


_root: _Root | None = None


def unique_id(r: HostedRank) -> bytes:
    """The 128 bytes of a fresh ncclUniqueId. inproc: a counter of the run (deterministic, so
    a seed replays); procs: this process's store port and a fresh secret."""
    global _root
    if r.world is not None:
        n = _inproc_ids.setdefault(r.world, [0])
        n[0] += 1
        body = b"inproc" + n[0].to_bytes(8, "little")
    else:
        if _root is None:
            _root = _Root()
        _root.made += 1
        body = (b"procs!" + _root.port.to_bytes(2, "little") + _root.made.to_bytes(4, "little")
                + os.urandom(32) + _root.secret)
    return (_MAGIC + body).ljust(ID_BYTES, b"\0")


class _Prefixed:
    """A store client whose keys live under one communicator's prefix (one store serves every
    id its process made)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self._s, self._p = store, prefix

    def set(self, key: str, value: Any) -> None:
        self._s.set(self._p + key, value)

    def get(self, key: str) -> bytes:
        return self._s.get(self._p + key)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._s.multi_get([self._p + k for k in keys])

    def add(self, key: str, amount: int) -> int:
        return self._s.add(self._p + key, amount)

    def check(self, keys: list[str]) -> bool:
        return self._s.check([self._p + k for k in keys])

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        self._s.wait([self._p + k for k in keys], timeout)

    def delete_key(self, key: str) -> bool:
        return self._s.delete_key(self._p + key)

    def set_timeout(self, timeout: Any) -> None:
        self._s.set_timeout(timeout)


def _timeout() -> float:
    run = process_run()
    return float(run.timeout) if run is not None else 60.0


@dataclass
class Membership:
    group: Any
    transport: Any
    ctx: str
    members: tuple[int, ...]


def rendezvous(r: HostedRank, st: RankNccl, blob: bytes, nranks: int, rank: int,
               site: str) -> Membership:
    """Meet the other ranks of unique id `blob`; the communicator's group and transport."""
    if not blob.startswith(_MAGIC):
        # A real NCCL would try to reach whatever address these bytes hold and fail in its
        # bootstrap (UNCONFIRMED which code: ncclSystemError or ncclRemoteError).
        raise NcclFailure(SYSTEM, "ncclCommInitRank: the unique id was not made by "
                                  "ncclGetUniqueId of this run (bootstrap cannot connect)")
    gen = st.inits.get(blob, 0)
    st.inits[blob] = gen + 1
    name = f"nccl {blob[len(_MAGIC):len(_MAGIC) + 14].hex()}#{gen}"
    if r.world is not None:
        return _inproc(r, blob, gen, name, nranks, rank, site)
    return _procs(blob, gen, name, nranks, rank)


def _inproc(r: HostedRank, blob: bytes, gen: int, name: str, nranks: int, rank: int,
            site: str) -> Membership:
    table = _checkins.setdefault(r.world, {})
    entry = table.setdefault((blob, gen), {"nranks": nranks, "ranks": {}})
    # NCCL's bootstrap root refuses a second check-in of one rank and a differing rank count
    # (src/bootstrap.cc "rank %d of %d ranks has already checked in", "mismatch in rank
    # count"); which code the callers then see is UNCONFIRMED: ncclInvalidUsage here.
    if entry["nranks"] != nranks:
        raise NcclFailure(INVALID_USAGE, f"ncclCommInitRank: nranks {nranks} but another rank "
                                         f"of this unique id passed {entry['nranks']}")
    if rank in entry["ranks"]:
        raise NcclFailure(INVALID_USAGE, f"ncclCommInitRank: rank {rank} of {nranks} has "
                                         f"already checked in (world rank {entry['ranks'][rank]})")
    entry["ranks"][rank] = r.rank
    ranks = entry["ranks"]
    if len(ranks) < nranks:
        wait_until(lambda: len(ranks) >= nranks,
                   f"ncclCommInitRank(nranks={nranks}, rank={rank}) at {site}: waiting for "
                   f"the other ranks of the unique id ({len(ranks)} of {nranks} checked in)")
    members = tuple(ranks[i] for i in range(nranks))
    entry["taken"] = entry.get("taken", 0) + 1
    if entry["taken"] == nranks:
        del table[(blob, gen)]      # every rank has its membership: the check-in is spent
    group = r.world.shared_group(f"nccl:{blob.hex()}#{gen}", name, members, rank)
    return Membership(group, InprocTransport(r.world), f"nccl:{blob.hex()}#{gen}", members)


def _procs(blob: bytes, gen: int, name: str, nranks: int, rank: int) -> Membership:
    body = blob[len(_MAGIC):]
    if not body.startswith(b"procs!"):
        raise NcclFailure(SYSTEM, "ncclCommInitRank: a unique id made by an in-process rank "
                                  "cannot be reached from another process")
    port = int.from_bytes(body[6:8], "little")
    made = int.from_bytes(body[8:12], "little")
    secret = body[12:44]
    timeout = _timeout()
    deadline = time.time() + timeout
    try:
        client = StoreClient("127.0.0.1", port, timeout=timeout, secret=body[44:76])
    except OSError as e:
        # the bootstrap root is gone (its process exited) or never was
        raise NcclFailure(SYSTEM, f"ncclCommInitRank: bootstrap connection to 127.0.0.1:{port} "
                                  f"failed: {e}") from None
    if _root is not None and port == _root.port:
        _root.own.append(client)
    store = _Prefixed(client, f"nccl/{made}/{secret[:8].hex()}/{gen}/")
    pw = ProcessWorld(store, rank, nranks, secret=secret, timeout=timeout)
    group = pw.join()
    ctx = f"{made}.{gen}"
    return Membership(group, ProcsTransport(pw, deadline), ctx, tuple(range(nranks)))


def run_version(r: HostedRank) -> int:
    """The run's NCCL version (the cluster's `versions.nccl`, commsim/versions.py) as
    NCCL_VERSION's number: what ncclGetVersion answers and what NCCL's rules compare."""
    return version_code(r.driver.cluster.versions.nccl)


def init_nccl(r: HostedRank, group: Any, rank: int, nranks: int, key: str = "") -> NcclComm:
    """ncclCommInitRank's work after the rendezvous: the simulated NCCL's init through this
    rank's driver (commsim/libmodels/nccl/comm.py). os.environ is the rank's own view while
    it runs (rankview.py swaps it per inproc rank). Its debug lines go to stdout under
    NCCL_DEBUG, as NCCL prints them (src/debug.cc: stdout unless NCCL_DEBUG_FILE)."""
    # The /dev/shm's size where the host's container sets one (ContainerCaps.shm_bytes).
    limit = r.driver.cluster.host(r.driver.gethostname()).container.shm_bytes or None
    store = DirShm(r.shm_dir, limit) if r.shm_dir else NamespaceShm(
        getattr(r.driver, "fabric", r.world), r.driver.shm_namespace(), limit)
    level = os.environ.get("NCCL_DEBUG", "")
    # OS processes pass fds over the proxy's Unix socket; in-process ranks over the driver's
    # fd channel (the scheduler waits on it).
    # Peers that pass fds share a host: the host is in the name, so two hosts' processes
    # (simulated pids repeat across hosts) never bind one abstract socket name; `key` (the
    # unique id) tells apart two communicators of one process whose groups share a name.
    tag = hashlib.sha256(f"{r.shm_dir}\0{r.driver.gethostname()}\0{group.name}\0{key}"
                         .encode()).hexdigest()[:16]
    fds = None if r.world is not None else process_transport(tag, r.driver)
    try:
        comm = nccl_init(r.driver, group, rank, nranks, dict(os.environ), store,
                         version=run_version(r), debug=level,
                         fds=fds)
    except NcclError as e:
        _print_debug(level, e.warn, r)
        raise NcclFailure(e.code, e.warn) from None      # ncclGetLastError: the WARN text
    for line in comm.log.shown():
        print(line, flush=True)
    return comm


def _print_debug(level: str, warn: str, r: HostedRank) -> None:
    if level.upper() in ("WARN", "INFO", "TRACE"):
        _, dev = r.driver.cudaGetDevice()
        print(f"\n{r.driver.gethostname()}:{r.driver.getpid()}:{r.driver.getpid()} [{int(dev)}] "
              f"NCCL WARN {warn}", flush=True)


# ---- element types and reductions ------------------------------------------------------------

def _widen(a: np.ndarray, dt: int) -> np.ndarray:
    """bfloat16 bits -> float32 (a bfloat16 is the high half of a float32)."""
    return (a.astype(np.uint32) << 16).view(np.float32) if dt == _BF16 else a


def _narrow(a: np.ndarray, dt: int) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (NaN kept a NaN), as the project's
    kernels store a float32 sum (commsim/kernels/collectives.py)."""
    if dt != _BF16:
        return a
    out = np.empty(a.shape, np.uint16)
    store_rounded(np.ascontiguousarray(a, np.float32).reshape(-1), out.reshape(-1).view(np.uint8), "bfloat16")
    return out


def reduce_parts(parts: list[np.ndarray], op: int, dt: int, count: int) -> np.ndarray:
    """The ranks' typed arrays reduced in rank order into one array of the same type."""
    if dt in _FP8:
        raise NotImplementedError(f"commsim hosting: libnccl reductions of "
                                  f"{DTYPES[dt][0]} are not simulated")
    npt = DTYPES[dt][1]
    half = dt in (6, _BF16)
    xs = [_widen(p, dt).astype(np.float32) if half else _widen(p, dt) for p in parts]
    if op in (0, 4):
        acc = functools.reduce(np.add, xs)
        if op == 4:
            n = len(parts)
            if np.issubdtype(acc.dtype, np.integer):
                # integer average truncates toward zero, as C's division (UNCONFIRMED for NCCL)
                acc = (np.sign(acc) * (np.abs(acc) // n)).astype(acc.dtype)
            else:
                acc = acc / acc.dtype.type(n)
    elif op == 1:
        acc = functools.reduce(np.multiply, xs)
    elif op == 2:
        acc = functools.reduce(np.maximum, xs)
    else:
        acc = functools.reduce(np.minimum, xs)
    with np.errstate(over="ignore"):     # a half product past 65504 is inf, as on the GPU
        if dt == _BF16:
            return _narrow(acc.astype(np.float32), dt)
        return acc.astype(npt)


def concat_parts(parts: list[np.ndarray], nbytes: int) -> np.ndarray:
    """All-gather: rank i's bytes at i * nbytes (nbytes is matched across ranks)."""
    return np.concatenate(parts)


def pick_part(parts: list[np.ndarray], root: int, nbytes: int) -> np.ndarray:
    """Broadcast: the root's bytes (the others pass none)."""
    return parts[root]
