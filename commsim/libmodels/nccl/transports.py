"""Per-peer connection set-up, with the driver calls real NCCL makes for each transport
(NVIDIA/nccl v2.27.3-1):

- P2P (src/transport/p2p.cc): the receiving rank allocates the buffer its peer writes into
  (ncclP2pAllocateShareableBuffer) and the sender maps it (ncclP2pImportShareableBuffer):
  * cuMem on, POSIX fd (ncclCuMemHandleType's default, src/misc/cudawrap.cc): cuMemCreate +
    cuMemAddressReserve + cuMemMap + cuMemSetAccess (ncclCuMemAlloc); the importer asks the
    owner's proxy, which exports the handle as an fd (cuMemExportToShareableHandle) and sends
    it over its Unix socket (ncclProxyClientGetFdBlocking); the importer then
    cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap, cuMemSetAccess.
  * cuMem on under MNNVL: the handle type is FABRIC (src/mnnvl.cc sets ncclCuMemHandleType),
    the 64-byte blob travels through the bootstrap and is imported directly.
  * cuMem off (NCCL_CUMEM_ENABLE=0): cudaMalloc + cudaIpcGetMemHandle ("cudaIpcGetMemHandle
    failed : %s" WARN), cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess) on the peer.
  Any failing call is CUDACHECK / CUCHECK: ncclUnhandledCudaError, and init fails; NCCL does
  not fall back to another transport once P2P was chosen for a pair.
- SHM (src/transport/shm.cc, src/misc/shmutils.cc): a /dev/shm/nccl-XXXXXX segment the
  receiver creates and the sender opens by path in its own /dev/shm (shm.py); a failure is
  ncclSystemError with ncclShmOpen's WARN.
- NET (src/transport/net.cc over the socket plugin): no driver call; the bytes travel over
  the bootstrap's sockets here (the group).
Connection set-up happens at init for every pair (NCCL_RUNTIME_CONNECT=0 behaviour;
NCCL 2.22+ connects lazily at the first collective by default: UNCONFIRMED whether a program
can tell, except by when an error appears, which here is ncclCommInitRank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from commsim.driver import FABRIC, FD, LAZY_ENABLE_PEER_ACCESS, access_desc, alloc_prop, error_string
from commsim.libmodels.nccl.calls import DriverCalls
from commsim.libmodels.nccl.errors import NcclError, REMOTE, shm_failure
from commsim.libmodels.nccl.shm import SEGMENT_BYTES, ShmStore
from commsim.libmodels.nccl.topo import PeerInfo
from commsim.libmodels.nccl_rules import NcclDecision

FLAG = 64                   # the flag word's line at the start of every connection buffer
CAP = 64 * 1024             # data bytes per step: NCCL's NCCL_BUFFSIZE default is 4 MiB
                            # (src/init.cc); a smaller buffer only adds steps here


@dataclass
class Conn:
    """This rank's connection with one peer: where the peer's bytes arrive (`recv`) and where
    this rank writes its own (`send`): device pointers for P2P, bytes for SHM, None for NET."""

    peer: int
    kind: str                   # P2P | SHM | NET
    via: str                    # as NCCL's INFO line names it: P2P/CUMEM, P2P/IPC, SHM, NET/Socket
    recv: Any = None
    send: Any = None
    handle: int | None = None   # a POSIX-fd buffer's cuMem handle, exported when the peer asks


@dataclass
class Resources:
    """What set-up made, undone in reverse by `release` (NCCL's transport free functions):
    `undo` this rank's own memory, `peers` its mappings of its peers' memory. A communicator
    whose ranks tear down together unmaps every peer's buffer (`release_peers`) before any
    rank frees its own, so no buffer is freed while a peer still has it open."""

    undo: list[Callable[[], None]] = field(default_factory=list)
    peers: list[Callable[[], None]] = field(default_factory=list)

    def release_peers(self) -> None:
        while self.peers:
            self.peers.pop()()

    def release(self) -> None:
        self.release_peers()
        while self.undo:
            self.undo.pop()()


def _round(size: int, gran: int) -> int:
    return (size + gran - 1) // gran * gran


def raise_voted(err: NcclError | None, errs: list[Any]) -> None:
    """After a step every rank has learnt over the bootstrap whether any rank failed it: the
    rank that failed returns its own error; the others ncclRemoteError, as their bootstrap
    socket to it closes when it gives up (src/misc/socket.cc "Connection closed by remote
    peer"; UNCONFIRMED that the peers learn it at this step rather than at their next
    receive)."""
    if err is not None:
        raise err
    bad = [r for r, e in enumerate(errs) if e is not None]
    if bad:
        raise NcclError(REMOTE, f"socketProgress: Connection closed by remote peer (rank "
                                f"{bad[0]} failed: {errs[bad[0]][1]})", origin=bad[0])


def vote(group: Any, err: NcclError | None, tag: str) -> None:
    """One step's outcome on every rank (raise_voted)."""
    raise_voted(err, group.all_gather_object(None if err is None else (err.code, err.warn), tag=tag))


class Connector:
    """One rank's set-up of all its connections (every rank runs it together)."""

    def __init__(self, calls: DriverCalls, group: Any, rank: int, infos: list[PeerInfo],
                 decision: NcclDecision, shm: ShmStore) -> None:
        self.c, self.group, self.rank, self.infos, self.d, self.shm = calls, group, rank, infos, decision, shm
        self.res = Resources()
        self.me = infos[rank]
        self.htype = FABRIC if decision.mnnvl else FD
        self.conns: dict[int, Conn] = {}
        for t in decision.transports:
            if rank in (t.a, t.b):
                peer = t.b if t.a == rank else t.a
                self.conns[peer] = Conn(peer, t.kind, self._via(t.kind))

    def _via(self, kind: str) -> str:
        if kind == "P2P":
            return ("P2P/CUMEM" if self.d.cumem else "P2P/IPC")
        return "SHM/direct/direct" if kind == "SHM" else "NET/Socket/0"

    # -- allocation (ncclCuMemAlloc / ncclCudaCalloc) -----------------------------------
    def cumem_alloc(self, size: int, htype: int) -> tuple[int, int, int]:
        """cuMemCreate + reserve + map + set access: (handle, ptr, size)."""
        c, dev = self.c, self.me.cuda_dev
        prop = alloc_prop(dev, htype)
        gran = c.check("cuMemGetAllocationGranularity", prop, 0)
        size = _round(size, int(gran))
        h = c.check("cuMemCreate", size, prop, 0)
        return h, self._map(h, size), size

    def _calloc(self, size: int) -> int:
        """ncclCudaCalloc (src/include/alloc.h): cudaMalloc, then zeroed."""
        c = self.c
        ptr = c.check("cudaMalloc", size)
        self.res.undo.append(lambda: c.call("cudaFree", ptr))
        c.check("cudaMemset", ptr, 0, size)
        return ptr

    def _map(self, h: int, size: int, peer: bool = False) -> int:
        """Reserve, map and grant access to a held handle (own, or a peer's imported)."""
        c, dev = self.c, self.me.cuda_dev
        undo = self.res.peers if peer else self.res.undo
        undo.append(lambda: c.call("cuMemRelease", h))
        ptr = c.check("cuMemAddressReserve", size, 0, 0, 0)
        undo.append(lambda: c.call("cuMemAddressFree", ptr, size))
        c.check("cuMemMap", ptr, size, 0, h, 0)
        undo.append(lambda: c.call("cuMemUnmap", ptr, size))
        c.check("cuMemSetAccess", ptr, size, [access_desc(dev)], 1)
        return ptr

    # -- the phases ------------------------------------------------------------------------
    def run(self) -> dict[int, Conn]:
        descs, err = {}, None
        try:
            descs = self._allocate()
        except NcclError as e:
            err = e
        got = self.group.all_gather_object((None if err is None else (err.code, err.warn), descs),
                                           tag="ncclCommInitRank: exchange connection info")
        raise_voted(err, [g[0] for g in got])
        err = None
        try:
            self._send_fds(got)
            self._connect(got)
        except NcclError as e:
            err = e
        vote(self.group, err, "ncclCommInitRank: connections set up")
        return self.conns

    def _allocate(self) -> dict[int, tuple]:
        """The receive side of every connection: a buffer per P2P peer (exported) and a
        segment per SHM peer; what the peer needs to reach it."""
        c, out = self.c, {}
        for peer, conn in sorted(self.conns.items()):
            if conn.kind == "P2P":
                if self.d.cumem:
                    h, ptr, size = self.cumem_alloc(FLAG + CAP, self.htype)
                    conn.recv = ptr
                    if self.htype == FABRIC:
                        blob = c.check("cuMemExportToShareableHandle", h, FABRIC, 0)
                        out[peer] = ("fabric", bytes(getattr(blob, "data", blob)), size)
                    else:
                        conn.handle = h
                        out[peer] = ("fd", self.me.pid, size)
                else:
                    ptr = self._calloc(FLAG + CAP)
                    conn.recv = ptr
                    out_ = c.call("cudaIpcGetMemHandle", ptr)
                    if int(out_[0]) != 0:
                        self.c.log.warn(f"cudaIpcGetMemHandle failed : {error_string(out_[0])}")
                        c.check("cudaIpcGetMemHandle", ptr)      # CUDACHECK(res): the same code
                    out[peer] = ("ipc", bytes(out_[1]), FLAG + CAP)
            elif conn.kind == "SHM":
                try:
                    path, buf = self.shm.create(FLAG + CAP, SEGMENT_BYTES)
                except OSError as e:
                    raise shm_failure(c.log, True, "/dev/shm/nccl-XXXXXX", SEGMENT_BYTES, e.errno) from None
                c.trace.append(("open(/dev/shm)", 0))
                conn.recv = buf
                self.res.undo.append(lambda path=path: self.shm.unlink(path))
                out[peer] = ("shm", path, FLAG + CAP)
        return out

    def _send_fds(self, got: list[Any]) -> None:
        """The proxy's side: every peer that maps one of this rank's POSIX-fd buffers gets its
        fd over the Unix socket (sent before anyone waits, so no rank waits on a sender that
        waits itself)."""
        c = self.c
        for peer, conn in sorted(self.conns.items()):
            h = conn.handle
            if h is None:
                continue
            fd = c.check("cuMemExportToShareableHandle", h, FD, 0)
            try:
                c.send_fd(fd, self.infos[peer].pid)
            finally:
                self.driver_close(fd)

    def driver_close(self, fd: int) -> None:
        self.c.driver.close_fd(fd)

    def _connect(self, got: list[Any]) -> None:
        """The send side: map every peer's receive buffer / open its segment."""
        c = self.c
        for peer, conn in sorted(self.conns.items()):
            if conn.kind == "NET":
                continue
            kind, what, size = got[peer][1][self.rank]
            if kind == "fd":
                fd = c.receive_fd(what)
                try:
                    h = c.check("cuMemImportFromShareableHandle", fd, FD)
                finally:
                    self.driver_close(fd)
                conn.send = self._map(h, size, peer=True)
            elif kind == "fabric":
                h = c.check("cuMemImportFromShareableHandle", what, FABRIC)
                conn.send = self._map(h, size, peer=True)
            elif kind == "ipc":
                ptr = c.check("cudaIpcOpenMemHandle", what, LAZY_ENABLE_PEER_ACCESS)
                self.res.peers.append(lambda ptr=ptr: c.call("cudaIpcCloseMemHandle", ptr))
                conn.send = ptr
            else:
                try:
                    conn.send = self.shm.attach(what, size)
                except OSError as e:
                    raise shm_failure(c.log, False, what, size, e.errno) from None
                c.trace.append(("open(/dev/shm)", 0))
            c.log.info(f"Channel 00/0 : {self.rank}[{self.me.nvml}] -> {peer}"
                       f"[{self.infos[peer].nvml}] via {conn.via}")
        for peer, conn in sorted(self.conns.items()):
            if conn.kind == "NET":
                c.log.info(f"Channel 00/0 : {self.rank}[{self.me.nvml}] -> {peer}"
                           f"[{self.infos[peer].nvml}] [send] via {conn.via}")
