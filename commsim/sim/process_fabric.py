"""ProcessFabric: one rank process's SimFabric in process mode.

Each rank process builds its own fabric from the scenario topology (the ground truth comes
from the scenario file, never from another process's Python objects). What must resolve across
processes is carried by bytes and by shared memory:

* device memory is a POSIX shm segment per allocation (`commsim.sim.shm`), named from a
  per-run prefix and the allocation id;
* a legacy IPC or FABRIC handle's 64 bytes encode the allocation id, the exporter's pid, its
  GPU and size, and a keyed checksum; the importer decodes them and maps the segment, so an
  import maps the same real bytes as the exporter;
* the peers' placement (pid -> host, GPU) is the scenario's, so the host, NVLink-domain and
  IMEX checks of the driver run from the topology exactly as in thread mode: a cross-host
  legacy IPC open still answers cudaErrorInvalidResourceHandle (row L8).

Allocation ids carry the rank in their high bits, so ids are unique across processes without
any coordination. Multicast objects stay process-local (see docs/processes.md: process mode
scopes policies to ipc, fabric and nccl).
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from typing import Protocol, Sequence

import numpy as np

from ..topology.model import Cluster, GpuRef
from . import shm
from .fabric import PhysicalAlloc, SimFabric, SimProcess
from .faults import ProcessFaults
from .ledger import Ledger

PID_BASE = 1000          # thread mode spawns rank r as pid 1000 + r; process mode keeps that
_HEAD = struct.Struct("<8sQQQQ")  # kind, aid, exporter pid, gpu code, size


class Mailbox(Protocol):
    """Where fds in flight wait (the store of the run: commsim.group.torch_dist.ProcessWorld)."""

    def post(self, key: str, value: bytes) -> None: ...

    def ready(self, key: str) -> bool: ...

    def take(self, key: str, what: str) -> bytes: ...


def rank_of_aid(aid: int) -> int:
    return (aid >> 32) - 1


class ProcessFabric(SimFabric):
    def __init__(self, cluster: Cluster, seed: int, rank: int, placement: Sequence[GpuRef],
                 prefix: str, mailbox: Mailbox | None = None,
                 disabled_rules: frozenset[str] = frozenset()) -> None:
        super().__init__(cluster, seed, memory=shm.ShmMemory(prefix), disabled_rules=disabled_rules)
        self.rank = rank
        self.prefix = prefix
        self.placement = tuple(placement)
        if mailbox is not None:
            self.fd_mailbox = StoreFdMailbox(self, mailbox)   # type: ignore[assignment]
        self.remote: set[int] = set()      # aids of allocations another process exported
        self._next_aid = ((rank + 1) << 32) | 1
        self._next_mid = ((rank + 1) << 32) | 1
        self._next_pid = PID_BASE + rank
        self._hosts = [h.name for h in cluster.hosts]
        # The peers as the OS would show them: a pid on a host. Only their placement is known.
        for r, g in enumerate(self.placement):
            if r != rank:
                pid = PID_BASE + r
                self.processes[pid] = SimProcess(pid, g.host, (), Ledger(pid), ProcessFaults())

    # -- handle bytes -----------------------------------------------------------------------
    def _gpu_code(self, g: GpuRef) -> int:
        return self._hosts.index(g.host) << 16 | g.index

    def _gpu_of(self, code: int) -> GpuRef | None:
        h = code >> 16
        if not 0 <= h < len(self._hosts):
            return None
        return GpuRef(self._hosts[h], code & 0xFFFF)

    def _seal(self, kind: bytes, aid: int, pid: int, gpu: GpuRef, size: int) -> bytes:
        head = _HEAD.pack(kind, aid, pid, self._gpu_code(gpu), size)
        return head + self._pad(head)

    def _pad(self, head: bytes) -> bytes:
        # Keyed by the run's seed, like SimFabric._blob: bytes from elsewhere do not resolve.
        return hashlib.blake2b(head + struct.pack("<Q", self.seed), digest_size=64).digest()[:64 - len(head)]

    def _open(self, key: bytes, kind: bytes) -> tuple[int, int, GpuRef, int] | None:
        """(aid, pid, gpu, size) of a handle this run sealed, else None (garbage bytes)."""
        if len(key) != 64:
            return None
        head = key[:_HEAD.size]
        k, aid, pid, code, size = _HEAD.unpack(head)
        gpu = self._gpu_of(code)
        if k != kind or gpu is None or key[_HEAD.size:] != self._pad(head):
            return None
        return aid, pid, gpu, size

    def ipc_handle_for(self, a: PhysicalAlloc, pid: int) -> bytes:
        h = self._seal(b"CSIPCMEM", a.aid, pid, a.gpu, a.size)
        self.ipc_handles[h] = (a.aid, pid)
        return h

    def fabric_handle_for(self, kind: str, oid: int) -> bytes:
        if kind != "mem":
            return super().fabric_handle_for(kind, oid)   # multicast: process-local
        a = self.allocs[oid]
        h = self._seal(b"CSFABRIC", oid, a.owner_pid, a.gpu, a.size)
        self.fabric_handles[h] = (kind, oid)
        return h

    # -- resolving another process's handles ----------------------------------------------
    def _attach(self, aid: int, pid: int, gpu: GpuRef, size: int, legacy: bool) -> PhysicalAlloc | None:
        a = self.allocs.get(aid)
        if a is not None and aid in self.remote and not shm.exists(self.prefix, f"a{aid}"):
            self._drop(a)         # the exporter freed it since we last looked
            a = None
        if a is not None:
            return a
        data = shm.attach(self.prefix, f"a{aid}", size)
        if data is None:
            return None
        # refs 0: the exporter holds the creation reference; imports add their own.
        a = PhysicalAlloc(aid, gpu, size, data, legacy, pid, refs=0)
        self.allocs[aid] = a
        self.remote.add(aid)
        return a

    def resolve_ipc_handle(self, key: bytes) -> tuple[int, int] | None:
        own = self.ipc_handles.get(key)
        if own is not None:
            return own
        got = self._open(key, b"CSIPCMEM")
        if got is None:
            return None
        aid, pid, gpu, size = got
        if rank_of_aid(aid) == self.rank:
            return None           # our own, already freed (it left ipc_handles then)
        if pid not in self.processes:
            return None
        exporter_host = self.processes[pid].host
        me = self.processes[PID_BASE + self.rank].host if PID_BASE + self.rank in self.processes else None
        if me is not None and exporter_host != me:
            # Row L8: across hosts the handle names nothing; do not even map the bytes. The
            # driver's own host check answers cudaErrorInvalidResourceHandle from the entry.
            self.allocs.setdefault(aid, PhysicalAlloc(aid, gpu, size, np.zeros(0, np.uint8),
                                                     True, pid, refs=0))
            self.remote.add(aid)
            return aid, pid
        a = self._attach(aid, pid, gpu, size, legacy=True)
        return None if a is None else (aid, pid)

    def resolve_fabric_handle(self, key: bytes) -> tuple[str, int] | None:
        own = self.fabric_handles.get(key)
        if own is not None:
            return own
        got = self._open(key, b"CSFABRIC")
        if got is None:
            return None
        aid, pid, gpu, size = got
        a = self._attach(aid, pid, gpu, size, legacy=False)
        return None if a is None else ("mem", aid)

    # -- freeing ------------------------------------------------------------------------------
    def _drop(self, a: PhysicalAlloc) -> None:
        a.freed = True
        self.allocs.pop(a.aid, None)
        self.remote.discard(a.aid)

    def free_alloc(self, a: PhysicalAlloc) -> None:
        if a.aid in self.remote:
            self._drop(a)         # our mapping goes; the exporter's segment is its own
            return
        super().free_alloc(a)

    def device_bytes_used(self, gpu: GpuRef) -> int:
        return sum(a.size for a in self.allocs.values() if a.gpu == gpu and a.aid not in self.remote)

    def live_bytes(self) -> int:
        return sum(a.size for a in self.allocs.values() if a.aid not in self.remote)



class StoreFdMailbox:
    """SimFabric.fd_mailbox for process mode, with the dict surface unix_socket.py uses
    (`setdefault(k, []).append(t)`, `get(k)`, `[k].pop(0)`), carried by the run's store: an
    fd's target travels with the exporter's GPU and size so the receiver maps the segment.
    send_fd has already refused a peer on another host (reference §2.5, row V9) from the
    placement, so only same-host fds get here."""

    def __init__(self, fabric: ProcessFabric, mailbox: Mailbox) -> None:
        self.fabric = fabric
        self.mailbox = mailbox

    def setdefault(self, key: tuple[int, int], default: object = None) -> "_Outbox":
        return _Outbox(self, key)

    def get(self, key: tuple[int, int], default: object = None) -> "_Inbox | None":
        box = _Inbox(self, key)
        return box if box.ready() else default

    def __getitem__(self, key: tuple[int, int]) -> "_Inbox":
        return _Inbox(self, key)


class _Outbox:
    def __init__(self, mb: StoreFdMailbox, key: tuple[int, int]) -> None:
        self.mb, self.key = mb, key

    def append(self, target: tuple[str, int]) -> None:
        f = self.mb.fabric
        kind, oid = target
        a = f.allocs.get(oid) if kind == "mem" else None
        desc = (kind, oid, a.owner_pid if a else 0, f._gpu_code(a.gpu) if a else 0, a.size if a else 0)
        self.mb.mailbox.post(f"fd/{self.key[0]}/{self.key[1]}", pickle.dumps(desc))


class _Inbox:
    def __init__(self, mb: StoreFdMailbox, key: tuple[int, int]) -> None:
        self.mb, self.key = mb, key

    def ready(self) -> bool:
        return self.mb.mailbox.ready(f"fd/{self.key[0]}/{self.key[1]}")

    def __bool__(self) -> bool:
        return self.ready()

    def pop(self, index: int = 0) -> tuple[str, int]:
        f = self.mb.fabric
        kind, oid, pid, code, size = pickle.loads(
            self.mb.mailbox.take(f"fd/{self.key[0]}/{self.key[1]}", "recvmsg"))
        gpu = f._gpu_of(code)
        if kind == "mem" and gpu is not None:
            f._attach(oid, pid, gpu, size, legacy=False)
        return kind, oid
