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

import importlib.abc
import importlib.machinery
import sys
import time
import types
from typing import Any

from commsim.hosting.surfaces.mpi import comm as mpi_comm
from commsim.hosting.surfaces.mpi.buffers import IN_PLACE
from commsim.hosting.surfaces.mpi.comm import Comm, Intracomm
from commsim.hosting.surfaces.mpi.ops import OPS, SUM, Op, as_op
from commsim.hosting.surfaces.mpi.results import (ANY_SOURCE, ANY_TAG, COMM_TYPE_SHARED, ERR_ARG, ERR_COMM,
                                                  ERR_OTHER, ERR_RANK, ERR_ROOT, ERR_TAG, ERR_TRUNCATE, PROC_NULL,
                                                  ROOT, UNDEFINED, Exception, Request, Status)
from commsim.hosting.surfaces.mpi.world import by_mpirun, rank_state
from commsim.hosting.install.patches import Patches, forget_module
from commsim.hosting.state.session import HostedRank, current, hosted
from commsim.hosting.install.dispatch import not_simulated
from commsim.hosting.install.registry import register_surface
from commsim.runtime.scheduler import in_rank, now

VERSION, SUBVERSION = 3, 1       # the MPI standard Open MPI 4.x/5.0 report (MPI_VERSION)
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3   # mpi.h
MAX_PROCESSOR_NAME = 256         # Open MPI: OPAL_MAX_PROCESSOR_NAME
SUCCESS = 0
INFO_NULL = None


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
    return now() if in_rank() else time.time()    # inproc: the scheduler's virtual clock


def Wtick() -> float:
    return 1e-9


COMM_WORLD = Intracomm()
COMM_WORLD._h = "world"
COMM_SELF = Intracomm()
COMM_SELF._h = "self"
COMM_NULL = Comm()

# mpi4py.MPI names the hosted surface knows but does not simulate: calling them says so.
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
    return installed() or (r is not None and by_mpirun(r))


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
    return hosted()


_FINDER = _Finder()
for _m in _MODULES.values():
    _m.__spec__.loader = _FINDER


def forget() -> None:
    """Drop the hosted modules a previous run of this interpreter imported, so that this
    run's first import asks `served_to` again (in-process runs share sys.modules); a real
    mpi4py the program had imported before hosting began stays replaced."""
    for name, mod in _MODULES.items():
        if name not in _replaced:
            forget_module(name, mod)


_replaced: set[str] = set()


def _install(patches: Patches) -> None:
    patches.finder(_FINDER, first=True)
    _replaced.clear()
    for name, mod in _MODULES.items():
        if name in sys.modules:      # the real one, imported before hosting began
            _replaced.add(name)
            patches.module(name, mod)


SURFACE = register_surface("mpi4py", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall

__all__ = ["rank_state", "as_op", "install", "uninstall", "SUM", "COMM_WORLD", "COMM_SELF",
           "COMM_NULL", "mpi_comm"]
