"""ncclCommInitRank on the simulated machine, as a client of the process's driver
(src/init.cc initTransportsRank, NVIDIA/nccl v2.27.3-1), and the communicator it makes:

1. fillInfo + bootstrap all-gather + topology detection (topo.py);
2. duplicate-GPU check, cuMem / MNNVL / NVLS eligibility and each pair's transport: the
   decision model's search (commsim/libmodels/nccl_rules.py `decide`, fed by topo.py);
3. the MNNVL check where the model turns MNNVL on: allocate a FABRIC buffer, export and
   import it (src/mnnvl.cc ncclMnnvlCheck); a failure is ncclSystemError with its WARN;
4. NVLS (nvls.py), and connection set-up per peer (transports.py): at init under
   NCCL_RUNTIME_CONNECT=0, else at the first collective (`NcclComm.connect`). NCCL connects
   every channel's peers at init up to 2.21 (NVIDIA/nccl#1034: "NCCL connects all possible
   topology during init"); from 2.22 it connects at runtime by default, and
   NCCL_RUNTIME_CONNECT=0 restores building "all the channel connectivity" at init
   (aws/aws-ofi-nccl#1007); src/enqueue.cc ncclCollPreconnect then connects what the
   collective's algorithm needs. The first version with runtime connect, 2.22, is
   UNCONFIRMED (no release note was read). NVLS is set up whole at init here, although
   under runtime connect NCCL binds its buffers at the first NVLS collective
   (ncclNvlsBufferSetup from ncclCollPreconnect): UNCONFIRMED which calls move.
The search (topology -> decision) is a pure function of what the ranks' driver queries
answered and of the variables; it is computed once per distinct (peer infos, variables)
in a process (`_search`), as every rank of a communicator and every run of one machine
asks it again.
A failing step fails init on the rank it failed on (its code and WARN); its peers see
ncclRemoteError (transports.raise_voted). What was set up is released on failure, and by
`close` (ncclCommDestroy), so the process's ledger returns to zero.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from commsim.driver import CAPTURE_MODE_RELAXED, FABRIC
from commsim.libmodels.nccl import nvls, topo
from commsim.libmodels.nccl.calls import DriverCalls
from commsim.libmodels.nccl.errors import (RESULT_CODES, SYSTEM, NcclError, NcclLog)
from commsim.libmodels.nccl.shm import ShmStore
from commsim.libmodels.nccl.transports import Conn, Connector, raise_voted
from commsim.libmodels.nccl_rules import ENV_VARS, NcclDecision, decide, parse_env

DEFAULT_VERSION = 22703         # NCCL_VERSION(2,27,3), where a caller names no version
RUNTIME_CONNECT_SINCE = 22200   # NCCL_VERSION(2,22,0): connections at the first collective
CUDA_IPC_MIN = 2 << 20          # src/include/alloc.h: the MNNVL check's buffer size

_MNNVL_WARN = ("MNNVL (cliqueSize {n}) is available but not working on this system. Check the "
               "IMEX configuration (nvidia-imex-ctl -N). Set NCCL_MNNVL_ENABLE=0 to ignore this issue.")
_MNNVL_ALLOC_WARN = ("MNNVL (cliqueSize {n}) is available but not working on this system. Check "
                     "the IMEX channel configuration (/dev/nvidia-caps-imex-channels). Set "
                     "NCCL_MNNVL_ENABLE=0 to ignore this issue.")


@dataclass
class NcclComm:
    """One rank's communicator: what NCCL decided, what set-up made, its debug log."""

    rank: int
    nranks: int
    group: Any
    decision: NcclDecision
    conns: dict[int, Conn]
    nvls_note: str
    calls: DriverCalls
    connector: Connector
    version: int
    step: int = 0                       # collectives run (the flag value of the data path)
    alive: bool = True
    notes: list[str] = field(default_factory=list)
    connected: bool = False

    def connect(self) -> None:
        """The connections' set-up, once (every rank of the communicator calls it together,
        at init or at its first collective): NcclError where a peer's set-up fails; what
        was set up stays until `close`."""
        if not self.connected:
            self.connected = True
            # The group launch runs with the thread's stream-capture mode relaxed
            # (src/group.cc), so a first collective inside a CUDA graph capture may still
            # allocate and export its buffers (UNCONFIRMED that the connect is inside it).
            c = self.calls
            old = c.check("cudaThreadExchangeStreamCaptureMode", CAPTURE_MODE_RELAXED)
            try:
                self.conns.update(self.connector.run())
            finally:
                c.call("cudaThreadExchangeStreamCaptureMode", old)

    @property
    def log(self) -> NcclLog:
        return self.calls.log

    def transports(self) -> dict[int, str]:
        return {p: c.via for p, c in self.conns.items()}

    def unmap_peers(self) -> None:
        """The first half of a teardown the ranks make together: this rank's mappings of its
        peers' buffers go (then a barrier, then `close` frees each rank's own)."""
        if self.alive:
            self.connector.res.release_peers()

    def close(self) -> None:
        """ncclCommDestroy: unmap, free and release what set-up made (reverse order)."""
        if self.alive:
            self.alive = False
            self.connector.res.release()
            close = getattr(self.calls.fds, "close", None)
            if close is not None:
                close()


def version_code(version: tuple[int, ...]) -> int:
    """NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z (nccl.h, NCCL 2.9 and later): the
    number ncclGetVersion gives and the rules compare, from the run's NCCL version
    (commsim/versions.py `Versions.nccl`)."""
    x, y, z = (tuple(version) + (0, 0, 0))[:3]
    return x * 10000 + y * 100 + z


def _modelled(env: Mapping[str, str]) -> dict[str, str]:
    # NCCL reads many more variables (NCCL_DEBUG, NCCL_SOCKET_IFNAME ...); the model's
    # variables change its search, the others change nothing here.
    return {k: v for k, v in env.items() if k in ENV_VARS}


def runtime_connect(env: Mapping[str, str], version: int) -> bool:
    """Whether connections wait for the first collective (module docstring)."""
    return version >= RUNTIME_CONNECT_SINCE and env.get("NCCL_RUNTIME_CONNECT", "1").strip() != "0"


@functools.lru_cache(maxsize=512)
def _search(infos: tuple[topo.PeerInfo, ...], env: tuple[tuple[str, str], ...]) -> NcclDecision:
    envd = dict(env)
    d = decide(topo.machine(list(infos)), parse_env(envd))
    if d.init_error is not None and d.init_error[0] == "ncclSystemError":
        # The model's MNNVL verdict says the FABRIC self-test fails; here the self-test is
        # run through the driver instead, so the search goes on as if it passed.
        d = decide(topo.machine([_with_imex(p) for p in infos]), parse_env(envd))
    return d


def _mnnvl_check(c: DriverCalls, conn: Connector, clique: int) -> None:
    """src/mnnvl.cc ncclMnnvlCheck: FABRIC memory allocated, exported and imported again."""
    try:
        h, _, _ = conn.cumem_alloc(CUDA_IPC_MIN, FABRIC)
    except NcclError:
        warn = _MNNVL_ALLOC_WARN.format(n=clique)
        c.log.warn(warn)
        conn.res.release()
        raise NcclError(SYSTEM, warn, "cuMemCreate") from None
    out = c.call("cuMemExportToShareableHandle", h, FABRIC, 0)
    ok = int(out[0]) == 0
    if ok:
        back = c.call("cuMemImportFromShareableHandle", bytes(getattr(out[1], "data", out[1])), FABRIC)
        ok = int(back[0]) == 0
        if ok:
            c.call("cuMemRelease", back[1])
    conn.res.release()
    if not ok:
        warn = _MNNVL_WARN.format(n=clique)
        c.log.warn(warn)
        raise NcclError(SYSTEM, warn, "cuMemImportFromShareableHandle")


def init(driver: Any, group: Any, rank: int, nranks: int, env: Mapping[str, str],
         shm: ShmStore, version: int = DEFAULT_VERSION, debug: str = "",
         fds: Any = None) -> NcclComm:
    """Every rank of `group` calls it together; NcclError where NCCL's init fails (the
    rank's log holds the WARN lines). `fds`: how fds travel between ranks (calls.py)."""
    _, dev = driver.cudaGetDevice()
    log = NcclLog(driver.gethostname(), driver.getpid(), int(dev), debug)
    calls = DriverCalls(driver, log, fds=fds)
    infos = group.all_gather_object(topo.local_info(driver, rank),
                                    tag="ncclCommInitRank: bootstrap all-gather of peer info")
    d = _search(tuple(infos), tuple(sorted(_modelled(env).items())))
    if d.init_error is not None:
        name, message = d.init_error
        log.warn(message)
        raise NcclError(RESULT_CODES[name], message)
    try:
        return _set_up(calls, group, rank, nranks, env, shm, version, fds, infos, d)
    except NcclError as e:
        e.decision = d          # what the search had decided (`commsim explain`)
        raise


def _set_up(calls: DriverCalls, group: Any, rank: int, nranks: int,
            env: Mapping[str, str], shm: ShmStore, version: int, fds: Any,
            infos: list[topo.PeerInfo], d: NcclDecision) -> NcclComm:
    """init after the search: the MNNVL check, then connections and NVLS as the version
    and NCCL_RUNTIME_CONNECT say."""
    log = calls.log
    conn = Connector(calls, group, rank, infos, d, shm)
    err = None
    if d.mnnvl:
        try:
            _mnnvl_check(calls, conn, sum(1 for p in infos if p.node == infos[rank].node))
        except NcclError as e:
            err = e
        raise_voted(err, group.all_gather_object(None if err is None else (err.code, err.warn),
                                                 tag="ncclCommInitRank: MNNVL check"))
        log.info(f"MNNVL 1 cliqueId {infos[rank].node[1]:x}")
    comm = NcclComm(rank, nranks, group, d, {}, "", calls, conn, version)
    try:
        if not runtime_connect(env, version):
            comm.connect()      # src/init.cc: ring and tree connections, then NVLS
        comm.nvls_note = nvls.setup(conn, version, d.env.nvls == 1) if d.nvls else \
            next((n for n in d.notes if n.startswith("NVLS")), "NVLS off")
    except NcclError:
        conn.res.release()
        if fds is not None:
            fds.close()
        raise
    log.info(f"comm rank {rank} nRanks {nranks} - Init COMPLETE")
    return comm


def _with_imex(p: topo.PeerInfo) -> topo.PeerInfo:
    return replace(p, facts=replace(p.facts, imex=True))
