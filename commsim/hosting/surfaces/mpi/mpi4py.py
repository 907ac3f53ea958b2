"""`mpi4py` and `mpi4py.MPI` as a hosted rank sees them (the real one would initialise a real
MPI at import): where mpi4py is installed, and in every rank `--launcher mpirun` started
(the simulated MPI installation); a torchrun rank without mpi4py installed cannot import it.

Serving stacks that set up IPC and MNNVL buffers often talk MPI: TensorRT-LLM's
`_ipc_utils.py` splits `mpi_comm()` by pipeline/context rank and all-gathers the 64 bytes of
each cudaIpcMemHandle_t; its `_utils.py` wraps COMM_WORLD in `mpi4py.util.pkl5.Intracomm` and
splits it with `Split_type(OMPI_COMM_TYPE_HOST)`; FlashInfer's `comm/mnnvl.py` and
`comm_backend.py` (`MpiComm`, `MPIBackend`) do `MPI.COMM_WORLD.Split`, all-gather fabric
handles and `bcast`. Installing this surface puts stand-ins for `mpi4py`, `mpi4py.MPI`,
`mpi4py.util` and `mpi4py.util.pkl5` into sys.modules; every call answers for the running
rank (session.current()).

Who is in COMM_WORLD: under `--launcher mpirun` the run's ranks (the process's
OMPI_COMM_WORLD_RANK/SIZE say so, as they tell Open MPI). A process started without mpirun
(`--launcher torchrun`, or a process a rank spawned) gets a world of one, as MPI's
"singleton MPI_INIT" gives (MPI-3.1 section 10.5.2), and the verdict notes it.

Served: COMM_WORLD, COMM_SELF, COMM_NULL; Comm.Get_rank/Get_size/rank/size, barrier/Barrier,
allgather, gather, bcast, scatter, allreduce/reduce (ops SUM, PROD, MAX, MIN, LAND, LOR,
BAND, BOR, LXOR, BXOR, MAXLOC, MINLOC), alltoall, send/recv/sendrecv/isend/irecv (tags,
ANY_SOURCE, ANY_TAG, Status), Split, Split_type (COMM_TYPE_SHARED: the ranks sharing the
simulated host's /dev/shm; Open MPI's OMPI_COMM_TYPE_HOST = 9: the ranks of one simulated
host), Dup/Clone, Free, Allgather/Bcast/Allreduce/Send/Recv on buffers; MPI.Init,
Init_thread, Finalize, Is_initialized, Is_finalized, Query_thread, Get_processor_name (the
simulated hostname), Get_version, Wtime. Anything else of mpi4py raises
NotImplementedError("commsim hosting: mpi4py.MPI.<name> is not simulated").
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import operator
import os
import sys
import threading
import time
import types
from typing import Any, Callable

import numpy as np

from commsim.hosting.surfaces.mpi import comm as mpi_comm
from commsim.hosting.surfaces.mpi.buffers import IN_PLACE
from commsim.hosting.surfaces.mpi.comm import (ANY_SOURCE, ANY_TAG, COMM_TYPE_SHARED, ERR_ARG, ERR_COMM, ERR_OTHER,
                       ERR_RANK, ERR_ROOT, ERR_TAG, ERR_TRUNCATE,
                       PROC_NULL, ROOT, UNDEFINED, Comm, Exception, Handle, Intracomm,
                       Request, Status)
from commsim.hosting.wire.ranks import (InprocTransport, SoloGroup, SoloTransport, Transport,
                            procs_transport)
from commsim.hosting.install.nesting import nested
from commsim.hosting.state.session import HostedRank, current
from commsim.hosting.install.registry import not_simulated, register_surface

KEY = "mpi4py"
VERSION, SUBVERSION = 3, 1       # the MPI standard Open MPI 4.x/5.0 report (MPI_VERSION)
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3   # mpi.h
MAX_PROCESSOR_NAME = 256         # Open MPI: OPAL_MAX_PROCESSOR_NAME
SUCCESS = 0
INFO_NULL = None


class RankMPI:
    """One rank's MPI: its transport, COMM_WORLD and COMM_SELF, finalisation."""

    def __init__(self, r: HostedRank, transport: Transport) -> None:
        self.world_rank = r.rank
        self.transport = transport
        self.world: Handle = None       # type: ignore[assignment]
        self.self_: Handle = None       # type: ignore[assignment]
        self.finalized = False


def _by_mpirun(r: HostedRank) -> bool:
    size, rank = os.environ.get("OMPI_COMM_WORLD_SIZE"), os.environ.get("OMPI_COMM_WORLD_RANK")
    return (size is not None and rank is not None and r.slot < r.world_size
            and size == str(r.world_size) and rank == str(r.rank))


def _start(r: HostedRank) -> RankMPI:
    if not _by_mpirun(r):
        r.events.note("mpi4py: this process was not started by mpirun, so MPI.COMM_WORLD is "
                      "this process alone (singleton MPI_Init); use --launcher mpirun")
        t: Transport = SoloTransport(r.rank)
        members, me = (r.rank,), 0
    elif r.mode == "inproc":
        t = InprocTransport(r.world)
        members, me = tuple(range(r.world_size)), r.rank
    else:
        from commsim.launch.bootstrap import run_config
        cfg = run_config()
        t = procs_transport(r.rank, r.world_size, cfg.run_dir, cfg.timeout)
        members, me = tuple(range(r.world_size)), r.rank
    st = RankMPI(r, t)
    st.world = Handle(st, t.group("w", "MPI_COMM_WORLD", members, me), "w", "MPI_COMM_WORLD",
                      members, me)
    st.self_ = Handle(st, SoloGroup("MPI_COMM_SELF", r.rank), f"self{r.rank}", "MPI_COMM_SELF",
                      (r.rank,), 0)
    return st


def rank_state() -> RankMPI:
    """The running rank's MPI, started on its first call (mpi4py initialises MPI at import)."""
    r = current()
    st = r.state.get(KEY)
    if st is None:
        st = r.state[KEY] = _start(r)
    return st


# ---- reduction operations ---------------------------------------------------------------------

def _loc(better: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    # MAXLOC/MINLOC on (value, location) pairs: ties go to the lower location (MPI-3.1 5.9.4).
    def pick(a: Any, b: Any) -> Any:
        if better(a[0], b[0]) or (a[0] == b[0] and a[1] <= b[1]):
            return a
        return b
    return pick


class Op:
    """mpi4py.MPI.Op: predefined operations. For Python objects mpi4py applies them with
    Python's operators (SUM: +, PROD: *, LAND: and, BAND: &, ...); for buffers elementwise."""

    def __init__(self, name: str, py: Callable[[Any, Any], Any], ufunc: Any) -> None:
        self.name = name
        self._py = py
        self._ufunc = ufunc

    def __call__(self, x: Any, y: Any) -> Any:
        return self._py(x, y)

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Op {self.name}>"

    def Is_commutative(self) -> bool:
        return True

    def fold(self, values: list[Any]) -> Any:
        return functools.reduce(self._py, values)     # in rank order

    def fold_arrays(self, arrays: list[Any]) -> Any:
        if self._ufunc is None:
            raise NotImplementedError(f"commsim hosting: mpi4py.MPI.{self.name} on buffers is "
                                      f"not simulated")
        return functools.reduce(self._ufunc, arrays)

    Create = staticmethod(not_simulated("mpi4py.MPI.Op.Create"))


SUM = Op("SUM", operator.add, np.add)
PROD = Op("PROD", operator.mul, np.multiply)
MAX = Op("MAX", lambda a, b: b if b > a else a, np.maximum)
MIN = Op("MIN", lambda a, b: b if b < a else a, np.minimum)
LAND = Op("LAND", lambda a, b: bool(a) and bool(b), np.logical_and)
LOR = Op("LOR", lambda a, b: bool(a) or bool(b), np.logical_or)
LXOR = Op("LXOR", lambda a, b: bool(a) != bool(b), np.logical_xor)
BAND = Op("BAND", operator.and_, np.bitwise_and)
BOR = Op("BOR", operator.or_, np.bitwise_or)
BXOR = Op("BXOR", operator.xor, np.bitwise_xor)
MAXLOC = Op("MAXLOC", _loc(operator.gt), None)
MINLOC = Op("MINLOC", _loc(operator.lt), None)
OPS = (SUM, PROD, MAX, MIN, LAND, LOR, LXOR, BAND, BOR, BXOR, MAXLOC, MINLOC)


def as_op(op: Any) -> Op:
    if isinstance(op, Op):
        return op
    raise TypeError(f"expecting an mpi4py.MPI.Op (MPI.SUM, MPI.MAX, ...), got {op!r}")


class Datatype:
    """mpi4py.MPI.Datatype: named in buffer specifications ([array, MPI.DOUBLE]); the
    hosted buffer methods move the buffer's bytes, so only the name is kept."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Datatype {self.name}>"


DATATYPES = {n: Datatype(n) for n in (
    "BYTE", "CHAR", "SHORT", "INT", "LONG", "LONG_LONG", "UNSIGNED_CHAR", "UNSIGNED",
    "UNSIGNED_LONG", "FLOAT", "DOUBLE", "BOOL", "C_BOOL", "INT8_T", "INT16_T", "INT32_T",
    "INT64_T", "UINT8_T", "UINT16_T", "UINT32_T", "UINT64_T", "FLOAT16", "AINT")}

# ---- module-level functions -------------------------------------------------------------------


def Is_initialized() -> bool:
    return True          # mpi4py initialises MPI when mpi4py.MPI is imported (rc.initialize)


def Is_finalized() -> bool:
    return rank_state().finalized


def Init() -> None:
    # MPI_Init may be called once; mpi4py has already called it at import. UNCONFIRMED: the
    # error class Open MPI reports for the second call.
    raise Exception(ERR_OTHER, "MPI.Init: MPI is already initialized (mpi4py initializes it "
                               "when mpi4py.MPI is imported)")


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    Init()
    return THREAD_MULTIPLE


def Query_thread() -> int:
    return THREAD_MULTIPLE      # mpi4py requests MPI_THREAD_MULTIPLE by default (rc.thread_level)


def Is_thread_main() -> bool:
    return True


def Finalize() -> None:
    st = rank_state()
    if st.finalized:
        raise Exception(ERR_OTHER, "MPI.Finalize called twice")
    st.finalized = True
    finish = getattr(getattr(st.transport, "pw", None), "finish", None)
    if finish is not None:
        finish()


def Get_processor_name() -> str:
    return current().host


def Get_version() -> tuple[int, int]:
    return (VERSION, SUBVERSION)


def Get_library_version() -> str:
    return "Open MPI (commsim hosted simulation of mpirun)"


def Wtime() -> float:
    from commsim.runtime.scheduler import in_rank, now
    return now() if in_rank() else time.time()    # inproc: the scheduler's virtual clock


def Wtick() -> float:
    return 1e-9


COMM_WORLD = Intracomm()
COMM_WORLD._h = "world"
COMM_SELF = Intracomm()
COMM_SELF._h = "self"
COMM_NULL = Comm()

# mpi4py names the hosted surface knows but does not simulate: calling them says so.
COMM_NAMES = frozenset("""
    Abort Ack_failed Agree Allgatherv Alltoall Alltoallv Alltoallw Bsend Call_errhandler
    Compare Create Create_cart Create_graph Create_group Create_intercomm Disconnect
    Dup_with_info Gather Gatherv Get_attr Get_errhandler Get_group Get_info Get_parent
    Get_topology Iallgather Iallreduce Ibarrier Ibcast Igather Improbe Iprobe Ireduce
    Iscatter Mprobe Probe Reduce Reduce_scatter Reduce_scatter_block Rsend Scatter
    Scatterv Sendrecv Set_attr Set_errhandler Set_info Set_name Ssend Split_type_with_info
    exscan iprobe mprobe probe scan ibsend issend ssend bsend""".split())
MPI_NAMES = frozenset("""
    Alloc_mem Attach_buffer Compute_dims Detach_buffer File Free_mem Get_error_string Group
    Info Lookup_name Open_port Pcontrol Publish_name Register_datarep Unpublish_name Win
    Cartcomm Graphcomm Intercomm Message Prequest Grequest Errhandler Get_address
    Add_error_class Add_error_code Add_error_string Close_port""".split())


class _HostedModule(types.ModuleType):
    def __init__(self, name: str, known: frozenset = frozenset(), package: bool = False) -> None:
        super().__init__(name)
        self.__dict__["_known"] = known
        # importlib.util.find_spec of an imported module reads its __spec__ (ValueError when
        # None); a package's search path is empty: its submodules come from sys.modules.
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, origin="commsim hosting",
                                                       is_package=package)
        if package:
            self.__path__ = []

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__["_known"]:
            return not_simulated(f"{self.__name__}.{name}")
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"<commsim hosted module {self.__name__}>"


def _build() -> dict[str, types.ModuleType]:
    mpi = _HostedModule("mpi4py.MPI", MPI_NAMES)
    served = dict(
        COMM_WORLD=COMM_WORLD, COMM_SELF=COMM_SELF, COMM_NULL=COMM_NULL, Comm=Comm,
        Intracomm=Intracomm, Exception=Exception, Status=Status, Request=Request, Op=Op,
        Datatype=Datatype, IN_PLACE=IN_PLACE, INFO_NULL=INFO_NULL, ANY_SOURCE=ANY_SOURCE,
        ANY_TAG=ANY_TAG, PROC_NULL=PROC_NULL, ROOT=ROOT, UNDEFINED=UNDEFINED,
        COMM_TYPE_SHARED=COMM_TYPE_SHARED, THREAD_SINGLE=THREAD_SINGLE,
        THREAD_FUNNELED=THREAD_FUNNELED, THREAD_SERIALIZED=THREAD_SERIALIZED,
        THREAD_MULTIPLE=THREAD_MULTIPLE, VERSION=VERSION, SUBVERSION=SUBVERSION,
        MAX_PROCESSOR_NAME=MAX_PROCESSOR_NAME, SUCCESS=SUCCESS, ERR_COMM=ERR_COMM,
        ERR_RANK=ERR_RANK, ERR_ROOT=ERR_ROOT, ERR_TAG=ERR_TAG, ERR_ARG=ERR_ARG,
        ERR_TRUNCATE=ERR_TRUNCATE, ERR_OTHER=ERR_OTHER, Is_initialized=Is_initialized,
        Is_finalized=Is_finalized, Init=Init, Init_thread=Init_thread, Finalize=Finalize,
        Query_thread=Query_thread, Is_thread_main=Is_thread_main,
        Get_processor_name=Get_processor_name, Get_version=Get_version,
        Get_library_version=Get_library_version, Wtime=Wtime, Wtick=Wtick)
    served.update({op.name: op for op in OPS})
    served.update(DATATYPES)
    mpi.__dict__.update(served)
    pkl5 = _HostedModule("mpi4py.util.pkl5")

    class Pkl5Intracomm(Intracomm):
        """mpi4py.util.pkl5.Intracomm(comm): the same communicator, pickle protocol 5 with
        out-of-band buffers for large objects; by value all the same here."""
    Pkl5Intracomm.__name__ = Pkl5Intracomm.__qualname__ = "Intracomm"
    pkl5.__dict__.update(Intracomm=Pkl5Intracomm, Comm=Pkl5Intracomm, Request=Request,
                         Status=Status)
    util = _HostedModule("mpi4py.util", package=True)
    util.pkl5 = pkl5
    pkg = _HostedModule("mpi4py", frozenset({"get_config", "get_include", "profile",
                                             "futures"}), package=True)
    pkg.__version__ = "4.0.0"           # the mpi4py API this surface follows
    pkg.rc = types.SimpleNamespace(initialize=True, threads=True, thread_level="multiple",
                                   finalize=None, fast_reduce=True, recv_mprobe=True,
                                   errors="exception")
    pkg.MPI = mpi
    pkg.util = util
    return {"mpi4py": pkg, "mpi4py.MPI": mpi, "mpi4py.util": util, "mpi4py.util.pkl5": pkl5}


_MODULES = _build()
_saved: dict[str, Any] = {}
_lock = threading.Lock()


def installed() -> bool:
    """Whether the interpreter has the real mpi4py (found on sys.path, not in sys.modules)."""
    return importlib.machinery.PathFinder.find_spec("mpi4py") is not None


def served_to(r: HostedRank | None) -> bool:
    """Whether `import mpi4py` finds the hosted module: where mpi4py is installed, and in a
    rank `--launcher mpirun` started (the simulated machine's MPI installation stands in for
    it). A torchrun rank of an interpreter without mpi4py gets ModuleNotFoundError, as the
    real one does: FlashInfer's MPIBackend then says "mpi4py is not installed"
    (flashinfer/comm/comm_backend.py, 0.7.2.post1) instead of all-gathering over a world of
    one that does not exist."""
    return installed() or (r is not None and _by_mpirun(r))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `import mpi4py[.MPI|.util|.util.pkl5]` with the hosted modules where served."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        mod = _MODULES.get(name)
        if mod is None or not served_to(current_or_none()):
            return None
        return mod.__spec__

    def create_module(self, spec: Any) -> types.ModuleType:
        return _MODULES[spec.name]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def current_or_none() -> HostedRank | None:
    from commsim.hosting.state.session import hosted
    return hosted()


_FINDER = _Finder()
for _m in _MODULES.values():
    _m.__spec__.loader = _FINDER


def forget() -> None:
    """Drop the hosted modules a previous run of this interpreter imported, so that this
    run's first import asks `served_to` again (in-process runs share sys.modules)."""
    with _lock:
        for name, mod in _MODULES.items():
            if sys.modules.get(name) is mod and name not in _saved:
                del sys.modules[name]


def _install() -> None:
    with _lock:
        sys.meta_path.insert(0, _FINDER)
        for name, mod in _MODULES.items():
            if name in sys.modules:      # the real one, imported before hosting began
                _saved[name] = sys.modules[name]
                sys.modules[name] = mod


def _uninstall() -> None:
    with _lock:
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        for name in _MODULES:
            old = _saved.pop(name, None)
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


install, uninstall = nested(_install, _uninstall)
register_surface("mpi4py", install, uninstall)

__all__ = ["rank_state", "as_op", "install", "uninstall", "SUM", "COMM_WORLD", "COMM_SELF",
           "COMM_NULL", "mpi_comm"]
