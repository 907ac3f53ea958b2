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

* a multicast object's team (devices in join order, each device's binding: allocation id,
  offsets, size) is a small shm table `<prefix>-m<id>`, changed under an flock, so a
  multimem kernel in any process reduces over every member's unicast segment.

Allocation and multicast ids carry the rank in their high bits, so ids are unique across
processes without any coordination.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import json
import sys
import struct
from collections.abc import MutableMapping
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from commsim.topology.model import Cluster, GpuRef
from commsim.sim import shm
from commsim.sim.fabric import MulticastObject, PhysicalAlloc, SimFabric, SimProcess
from commsim.sim.faults import ProcessFaults
from commsim.sim.ledger import Ledger

PID_BASE = 1000          # thread mode spawns rank r as pid 1000 + r; process mode keeps that
_HEAD = struct.Struct("<8sQQQQ")  # kind, aid, exporter pid, gpu code, size


class Mailbox(Protocol):
    """Where fds in flight wait (the store of the run: commsim.group.torch_dist.ProcessWorld)."""

    def post(self, key: str, value: bytes) -> None: ...

    def ready(self, key: str) -> bool: ...

    def take(self, key: str, what: str) -> bytes: ...


def rank_of_aid(aid: int) -> int:
    return (aid >> 32) - 1


class RemoteAlloc(PhysicalAlloc):
    """Another process's allocation as this process maps it. A legacy (cudaMalloc) one counts
    as freed once its exporter has unlinked the segment: a cudaFree while a peer still has
    the handle open is undefined (row L15) and the driver faults and
    flags the peer's next access, as in thread mode. VMM memory instead lives on while
    mapped (row V13), which the unlinked-but-mapped segment gives by itself."""

    segment: Any = None
    _freed = False

    @property   # type: ignore[override]
    def freed(self) -> bool:
        if self._freed:
            return True
        if self.legacy and self.segment is not None and not self.segment.exists():
            self._freed = True
        return self._freed

    @freed.setter
    def freed(self, value: bool) -> None:
        self._freed = value


class MirroredLedger(Ledger):
    """This process's ledger; its open legacy IPC mappings are also marked in /dev/shm
    (`<prefix>-a<id>.open<pid>`, present while the mapping is held), so an exporter in another
    process can tell that a cudaFree comes while a peer still has the handle open (row L15)."""

    def __init__(self, pid: int, prefix: str) -> None:
        super().__init__(pid)
        self.prefix = prefix

    def add(self, kind: str, key: object, detail: str, *args: object, site: str | None = None) -> Any:
        it = super().add(kind, key, detail, *args, site=site)
        if kind == "ipc_mapping" and it.refs == 1:
            shm.touch(open_marker(self.prefix, key[1], self.pid))
        return it

    def remove(self, kind: str, key: object, all_refs: bool = False) -> None:
        super().remove(kind, key, all_refs)
        if kind == "ipc_mapping" and not self.has(kind, key):
            open_marker(self.prefix, key[1], self.pid).unlink(missing_ok=True)


class PeerLedger(Ledger):
    """A peer process's ledger as this process can observe it: only the open-IPC markers. A
    peer the run knows to be dead holds nothing: a rank killed while closing leaves its
    markers behind, and a survivor's cudaFree must not be blamed on a dead process."""

    def __init__(self, pid: int, prefix: str, dead: Callable[[int], bool] = lambda pid: False) -> None:
        super().__init__(pid)
        self.prefix = prefix
        self.dead = dead

    def has(self, kind: str, key: object) -> bool:
        if kind == "ipc_mapping" and isinstance(key, tuple):
            return open_marker(self.prefix, key[1], self.pid).exists() and not self.dead(self.pid)
        return False


def open_marker(prefix: str, aid: Any, pid: int) -> Any:
    return shm.segment_path(prefix, f"a{aid}.open{pid}")


def fabric_marker(prefix: str, kind: str, oid: int) -> Any:
    """Present once the owner of allocation (kind "mem") or multicast object ("mc") `oid` has
    exported it as a FABRIC handle."""
    return shm.segment_path(prefix, f"{'a' if kind == 'mem' else 'm'}{oid}.fabric")


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
        self._gpus = frozenset(GpuRef(h.name, i) for h in cluster.hosts for i in range(len(h.gpus)))
        # The peers as the OS would show them: a pid on a host. Only their placement is known.
        for r, g in enumerate(self.placement):
            if r != rank:
                pid = PID_BASE + r
                self.processes[pid] = SimProcess(pid, g.host, (),
                                                 PeerLedger(pid, prefix, self._peer_dead),
                                                 ProcessFaults())

    def _peer_dead(self, pid: int) -> bool:
        """Whether the run has declared the rank of sim pid `pid` dead (the launcher does so
        for a process that exited without a report)."""
        dead = getattr(getattr(self.fd_mailbox, "mailbox", None), "dead", None)
        return dead is not None and (pid - PID_BASE) in dead()

    def spawn(self, host: str, gpus: Any, faults: ProcessFaults | None = None) -> SimProcess:
        p = super().spawn(host, gpus, faults)
        p.ledger = MirroredLedger(p.pid, self.prefix)
        return p

    # -- handle bytes -----------------------------------------------------------------------
    def _gpu_code(self, g: GpuRef) -> int:
        return self._hosts.index(g.host) << 16 | g.index

    def _gpu_of(self, code: int) -> GpuRef | None:
        # Bytes from a forged or corrupted handle can name any host or GPU index: only a GPU
        # of this topology resolves (the driver then answers for a handle that names nothing).
        h = code >> 16
        if not 0 <= h < len(self._hosts):
            return None
        ref = GpuRef(self._hosts[h], code & 0xFFFF)
        return ref if ref in self._gpus else None

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
        # The driver hands out a FABRIC handle only for memory created exportable as FABRIC
        # (cuMemExportToShareableHandle has checked that); the marker tells an importer in
        # another process that this export happened, since the handle's bytes alone can be
        # made by anyone who knows the run's seed.
        shm.touch(fabric_marker(self.prefix, kind, oid))
        if kind == "mc":
            m = self.multicasts[oid]
            h = self._seal(b"CSFABMC_", oid, PID_BASE + rank_of_aid(oid), m.creator, m.size)
        else:
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
            self._say_missing(f"a{aid}", size)
            return None
        # refs 0: the exporter holds the creation reference; imports add their own.
        a = RemoteAlloc(aid, gpu, size, data, legacy, pid, refs=0)
        a.segment = shm.segment_path(self.prefix, f"a{aid}")
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

    def ipc_handle_origin(self, key: bytes) -> tuple[GpuRef, int] | None:
        """(GPU, exporter pid) the handle's bytes name, whether or not the memory is still there."""
        got = self._open(key, b"CSIPCMEM")
        return None if got is None else (got[2], got[1])

    def resolve_fabric_handle(self, key: bytes) -> tuple[str, int] | None:
        own = self.fabric_handles.get(key)
        if own is not None:
            return own
        # Bytes sealed like a handle for an object never exported as FABRIC (cudaMalloc memory,
        # a VMM allocation without the FABRIC type) name nothing: the driver answers
        # INVALID_VALUE as thread mode does for bytes it never made.
        got = self._open(key, b"CSFABMC_")
        if got is not None:
            if not fabric_marker(self.prefix, "mc", got[0]).exists():
                return None
            return None if self.attach_multicast(got[0]) is None else ("mc", got[0])
        got = self._open(key, b"CSFABRIC")
        if got is None or not fabric_marker(self.prefix, "mem", got[0]).exists():
            return None
        aid, pid, gpu, size = got
        a = self._attach(aid, pid, gpu, size, legacy=False)
        return None if a is None else ("mem", aid)

    def _say_missing(self, tag: str, size: int | None) -> None:
        """A handle this run sealed names a segment that is gone (its exporter freed it: the
        driver answers INVALID_VALUE, as for a stale handle) or is short. Said on stderr too:
        during set-up nothing frees, so there it points at something outside the run removing
        /dev/shm files, which the error code alone would hide."""
        p = shm.segment_path(self.prefix, tag)
        try:
            why = "missing" if size is None else f"size {p.stat().st_size} < {size}"
        except FileNotFoundError:
            why = "missing"
        sys.stderr.write(f"commsim[procs] rank {self.rank}: shared-memory segment {p} "
                         f"unusable at import ({why})\n")

    # -- freeing ------------------------------------------------------------------------------
    def _drop(self, a: PhysicalAlloc) -> None:
        a.freed = True
        self.allocs.pop(a.aid, None)
        self.remote.discard(a.aid)

    def free_alloc(self, a: PhysicalAlloc) -> None:
        if isinstance(a, RemoteAlloc) or a.aid in self.remote:
            # Our mapping goes; the exporter's segment is its own. A remote allocation that
            # was already dropped must not fall through and unlink the exporter's name.
            if self.allocs.get(a.aid) is a:
                self._drop(a)
            return
        super().free_alloc(a)
        fabric_marker(self.prefix, "mem", a.aid).unlink(missing_ok=True)

    def device_bytes_used(self, gpu: GpuRef) -> int:
        return sum(a.size for a in self.allocs.values() if a.gpu == gpu and a.aid not in self.remote)

    def live_bytes(self) -> int:
        return sum(a.size for a in self.allocs.values() if a.aid not in self.remote)


    # -- multicast teams in shared memory ----------------------------------------------------
    def new_multicast(self, creator: GpuRef, num_devices: int, size: int,
                      handle_types: int) -> MulticastObject:
        mid = self._next_mid
        self._next_mid += 1
        nbytes = team_bytes(num_devices)
        fd = shm.create(shm.segment_path(self.prefix, f"m{mid}"), nbytes)
        mm = mmap.mmap(fd, nbytes)
        _TEAM_HEAD.pack_into(mm, 0, num_devices, handle_types, self._gpu_code(creator), 0, size)
        m = SharedMulticast(self, mid, fd, mm, refs=1)
        self.multicasts[mid] = m
        return m

    def attach_multicast(self, mid: int) -> MulticastObject | None:
        """Another process's multicast object, from its table (None once it is gone)."""
        m = self.multicasts.get(mid)
        if m is not None:
            return m
        try:
            fd = os.open(shm.segment_path(self.prefix, f"m{mid}"), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            self._say_missing(f"m{mid}", None)
            return None
        m = SharedMulticast(self, mid, fd, mmap.mmap(fd, os.fstat(fd).st_size), refs=0)
        self.multicasts[mid] = m
        return m

    def unref_multicast(self, m: MulticastObject) -> None:
        """This process's last reference and mapping are gone. Its own bindings were undone
        by cuMulticastUnbind (or by the exit hook); other processes' bindings are theirs. The
        creator unlinks the table's name; open tables stay valid for the others."""
        m.refs -= 1
        if m.refs > 0 or m.maps > 0:
            return
        self._drop_own_bindings(m)
        self.multicasts.pop(m.mid, None)
        for h, (k, oid) in list(self.fabric_handles.items()):
            if k == "mc" and oid == m.mid:
                del self.fabric_handles[h]
        if isinstance(m, SharedMulticast):
            if rank_of_aid(m.mid) == self.rank:
                shm.segment_path(self.prefix, f"m{m.mid}").unlink(missing_ok=True)
                fabric_marker(self.prefix, "mc", m.mid).unlink(missing_ok=True)
            m.close()


    def _drop_own_bindings(self, m: MulticastObject) -> None:
        """The object goes from this process with memory of its still bound (released
        without cuMulticastUnbind): the binding goes with it, from the team table and from
        this process's ledger, as in thread mode (SimFabric.unref_multicast)."""
        for p in self.processes.values():
            for it in [it for it in p.ledger if it.kind == "multicast_binding"
                       and it.key[0] == m.mid]:
                g = next((g for g in m.bindings if str(g) == it.key[1]), None)
                if g is not None:
                    a = m.bindings[g][0]
                    del m.bindings[g]
                    a.maps -= 1
                    if a.refs <= 0 and a.maps <= 0:
                        self.free_alloc(a)
                p.ledger.remove("multicast_binding", it.key, all_refs=True)


# Team table: header (num_devices, handle types, creator GPU, joined count, size), then one
# slot per device in join order (GPU, bound, allocation id, allocation size, mem offset,
# mc offset, bound size).
_TEAM_HEAD = struct.Struct("<IIIIQ")
_SLOT = struct.Struct("<IIQQQQQ")


def team_bytes(num_devices: int) -> int:
    """A table with a slot for every device the object was created for (cuMulticastAddDevice
    refuses more than numDevices before a slot is written)."""
    return 64 + max(num_devices, 1) * _SLOT.size


class SharedMulticast(MulticastObject):
    """A MulticastObject whose `devices` and `bindings` live in the team table; `refs` and
    `maps` stay per process (each process holds its own handles and mappings)."""

    def __init__(self, fabric: ProcessFabric, mid: int, fd: int, mm: mmap.mmap, refs: int) -> None:
        n, types, code, _, size = _TEAM_HEAD.unpack_from(mm, 0)
        self.fabric, self.fd, self.mm = fabric, fd, mm
        self.mid, self.num_devices, self.size, self.handle_types = mid, n, size, types
        self.creator = fabric._gpu_of(code)
        self.refs, self.maps = refs, 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _slot(self, i: int) -> tuple:
        return _SLOT.unpack_from(self.mm, 64 + i * _SLOT.size)

    def _write(self, i: int, *fields: int) -> None:
        _SLOT.pack_into(self.mm, 64 + i * _SLOT.size, *fields)

    def _joined(self) -> int:
        return _TEAM_HEAD.unpack_from(self.mm, 0)[3]

    def _locked(self) -> Any:
        fd = self.fd

        class _Lock:
            def __enter__(self) -> None:
                fcntl.flock(fd, fcntl.LOCK_EX)   # AddDevice / BindMem race across processes

            def __exit__(self, *exc: object) -> None:
                fcntl.flock(fd, fcntl.LOCK_UN)
        return _Lock()

    def _index(self, g: GpuRef) -> int | None:
        code = self.fabric._gpu_code(g)
        for i in range(self._joined()):
            if self._slot(i)[0] == code:
                return i
        return None

    @property
    def devices(self) -> "_Devices":   # type: ignore[override]
        return _Devices(self, [self.fabric._gpu_of(self._slot(i)[0]) for i in range(self._joined())])

    @property
    def bindings(self) -> "_Bindings":   # type: ignore[override]
        return _Bindings(self)

    def add_device(self, g: GpuRef) -> None:
        with self._locked():
            n = self._joined()
            self._write(n, self.fabric._gpu_code(g), 0, 0, 0, 0, 0, 0)
            head = list(_TEAM_HEAD.unpack_from(self.mm, 0))
            head[3] = n + 1
            _TEAM_HEAD.pack_into(self.mm, 0, *head)


class _Devices(list):
    """The team's devices as a list; append joins the shared table."""

    def __init__(self, mc: SharedMulticast, items: list) -> None:
        super().__init__(items)
        self.mc = mc

    def append(self, g: GpuRef) -> None:   # type: ignore[override]
        self.mc.add_device(g)
        super().append(g)


class _Bindings(MutableMapping):
    """gpu -> (PhysicalAlloc, mem offset, mc offset, size), read from and written to the
    table; a peer's allocation is mapped from its segment when first read."""

    def __init__(self, mc: SharedMulticast) -> None:
        self.mc = mc

    def _entry(self, i: int) -> tuple | None:
        code, bound, aid, asize, mem_off, mc_off, size = self.mc._slot(i)
        if not bound:
            return None
        f = self.mc.fabric
        gpu = f._gpu_of(code)
        a = f.allocs.get(aid)
        if a is None and gpu is not None:
            a = f._attach(aid, PID_BASE + rank_of_aid(aid), gpu, asize, legacy=False)
        return None if a is None else (a, mem_off, mc_off, size)

    def __getitem__(self, g: GpuRef) -> tuple:
        i = self.mc._index(g)
        e = None if i is None else self._entry(i)
        if e is None:
            raise KeyError(g)
        return e

    def __setitem__(self, g: GpuRef, value: tuple) -> None:
        a, mem_off, mc_off, size = value
        with self.mc._locked():
            i = self.mc._index(g)
            if i is None:
                raise KeyError(g)
            self.mc._write(i, self.mc.fabric._gpu_code(g), 1, a.aid, a.size, mem_off, mc_off, size)

    def __delitem__(self, g: GpuRef) -> None:
        with self.mc._locked():
            i = self.mc._index(g)
            if i is None:
                raise KeyError(g)
            self.mc._write(i, self.mc.fabric._gpu_code(g), 0, 0, 0, 0, 0, 0)

    def __iter__(self) -> Iterator[GpuRef]:
        for i in range(self.mc._joined()):
            if self.mc._slot(i)[1]:
                yield self.mc.fabric._gpu_of(self.mc._slot(i)[0])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def clear(self) -> None:
        pass   # a process never clears the team's bindings of the others (unref_multicast)


class StoreFdMailbox:
    """SimFabric.fd_mailbox for process mode, with the dict surface sim/fd_channel.py uses
    (`setdefault(k, []).append(t)`, `get(k)`, `[k].pop(0)`), carried by the run's store: an
    fd's target travels with the exporter's GPU and size so the receiver maps the segment.
    SimFdChannel.send has already refused a peer on another host (row V9) from the
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
        # Plain JSON, never a pickle: the store is reachable by other local users.
        self.mb.mailbox.post(f"fd/{self.key[0]}/{self.key[1]}", json.dumps(desc).encode())


class _Inbox:
    def __init__(self, mb: StoreFdMailbox, key: tuple[int, int]) -> None:
        self.mb, self.key = mb, key

    def ready(self) -> bool:
        return self.mb.mailbox.ready(f"fd/{self.key[0]}/{self.key[1]}")

    def __bool__(self) -> bool:
        return self.ready()

    def pop(self, index: int = 0) -> tuple[str, int]:
        f = self.mb.fabric
        kind, oid, pid, code, size = json.loads(
            self.mb.mailbox.take(f"fd/{self.key[0]}/{self.key[1]}", "recvmsg"))
        gpu = f._gpu_of(code)
        if kind == "mem" and gpu is not None:
            f._attach(oid, pid, gpu, size, legacy=False)
        elif kind == "mc":
            f.attach_multicast(oid)
        return kind, oid
