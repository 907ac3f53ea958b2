"""SimFabric: the ground truth of one simulated cluster and the state shared between processes.

It owns the physical allocations (real bytes), the registries that turn handle bytes back into
allocations, multicast objects, and the simulated processes placed on hosts and GPUs. Nothing
in a handle is a Python object: a handle is bytes (or an fd number) and is looked up here, so
handles survive pickling and transport between ranks. Process mode
(`commsim.sim.process_fabric.ProcessFabric`) gives every rank process its own fabric with
POSIX shared memory behind its allocations and resolves handle bytes against that memory.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from commsim.topology.model import Cluster, GpuRef
from commsim.sim.faults import ProcessFaults
from commsim.sim.host_memory import MemoryProvider
from commsim.sim.ledger import Ledger


@dataclass(eq=False)
class PhysicalAlloc:
    """One physical allocation on one GPU: `cudaMalloc` memory or a `cuMemCreate` handle."""

    aid: int
    gpu: GpuRef
    size: int
    data: np.ndarray
    legacy: bool                    # cudaMalloc (IPC-capable) vs VMM (cuMemCreate)
    owner_pid: int
    handle_types: int = 0           # requested shareable types (VMM)
    refs: int = 1                   # VMM: creator + imports not yet released
    maps: int = 0                   # VMM: live cuMemMap mappings in any process
    freed: bool = False


@dataclass(eq=False)
class MulticastObject:
    mid: int
    creator: GpuRef
    num_devices: int
    size: int
    handle_types: int
    devices: list[GpuRef] = field(default_factory=list)
    # gpu -> (alloc, mem_offset, mc_offset, size)
    bindings: dict[GpuRef, tuple[PhysicalAlloc, int, int, int]] = field(default_factory=dict)
    refs: int = 1
    maps: int = 0


@dataclass
class SimProcess:
    pid: int
    host: str
    gpus: tuple[GpuRef, ...]        # visible devices, ordinal i -> gpus[i]
    ledger: Ledger
    faults: ProcessFaults
    current: int = 0
    alive: bool = True
    sticky: object = None           # a sticky CUDA error (row MC6): every later call returns it
    # The GPUs of the process's container (its device cgroup), host order: what NVML
    # enumerates there (sim/visibility.py). None: every GPU of the host (no cgroup).
    container: tuple[GpuRef, ...] | None = None


def is_undefined(flag: str) -> bool:
    """Whether a flagged event (SimFabric.flag) is undefined behaviour, not only a hazard."""
    return "undefined" in flag


class SimFabric:
    """Ground truth plus shared state for one simulated cluster."""

    def __init__(self, cluster: Cluster, seed: int = 0, memory: MemoryProvider | None = None,
                 disabled_rules: frozenset[str] = frozenset()):
        self.cluster = cluster
        # Rules (by row id, e.g. "L10") switched off, for mutation tests only: they prove a regression
        # scenario fails because of the simulator's semantics, not because of a fixed answer.
        self.disabled_rules = frozenset(disabled_rules)
        self.seed = seed
        self.memory = memory or MemoryProvider()
        self.processes: dict[int, SimProcess] = {}
        self.allocs: dict[int, PhysicalAlloc] = {}
        self.multicasts: dict[int, MulticastObject] = {}
        self.ipc_handles: dict[bytes, tuple[int, int]] = {}     # handle -> (aid, exporter pid)
        # Handles of freed memory -> (its GPU, exporter pid): the bytes still name the device.
        self.gone_ipc_handles: dict[bytes, tuple[GpuRef, int]] = {}
        self.fabric_handles: dict[bytes, tuple[str, int]] = {}  # handle -> ("mem"|"mc", id)
        self.fd_mailbox: dict[tuple[int, int], list[tuple[str, int]]] = {}  # (dst, src) -> fds in flight
        self.flags: list[str] = []   # undefined-behaviour events the run must report (L15, M6, V7)
        # Where in the program a flagged event happened: hosting sets it to the call site of
        # the hosted program (its frames outside commsim); the scenario runner leaves it unset.
        self.where: Callable[[], str] | None = None
        # pid -> what the process's driver must drop when the OS ends it (its mappings)
        self.exit_hooks: dict[int, Callable[[], None]] = {}
        # pid -> its SimDriver (the per-process fd table pidfd_getfd reads, row W7)
        self.drivers: dict[int, object] = {}
        # pid -> what must be settled before the leak report (fds the program closed itself)
        self.pre_exit_hooks: dict[int, Callable[[], None]] = {}
        self._next_aid = 1
        self._next_mid = 1
        self._next_pid = 1000
        self._host_of: dict[str, str] = {h.name: h.name for h in cluster.hosts}
        # Whether any pair has P2P that is reported but loses writes (row P3): the hot path of
        # SimDriver.view checks links only then.
        self.unreal_p2p = any(lk is not None and lk.lost_writes
                              for h in cluster.hosts for row in h.links for lk in row)
        self._used: dict[GpuRef, int] = {}     # live allocation bytes per GPU
        self._blobs: dict[tuple[bytes, tuple[int, ...]], bytes] = {}   # handle bytes made (_blob)

    # -- processes ------------------------------------------------------------------------
    def spawn(self, host: str, gpus: Iterable[GpuRef], faults: ProcessFaults | None = None) -> SimProcess:
        on_host = self.cluster.host(host).gpus
        gpus = tuple(gpus)
        for g in gpus:
            if g.host != host:
                raise ValueError(f"{g} is not on host {host}: a process sees only its host's GPUs")
            on_host[g.index]            # raises for a GPU the host does not have (Cluster.gpu)
        pid = self._next_pid
        self._next_pid += 1
        p = SimProcess(pid, host, gpus, Ledger(pid), faults or ProcessFaults())
        self.processes[pid] = p
        return p

    def exit_process(self, pid: int) -> list[str]:
        """End a process like the OS would: everything it held goes away. Returns the leak
        report (one line per ledger item still held), empty when it exited clean."""
        p = self.processes[pid]
        pre = self.pre_exit_hooks.pop(pid, None)
        if pre is not None:
            pre()
        leaks = [str(it) for it in p.ledger]
        p.alive = False
        hook = self.exit_hooks.pop(pid, None)
        if hook is not None:
            hook()   # the driver drops its VMM / multicast mappings and bindings
        for aid, a in list(self.allocs.items()):
            if a.owner_pid == pid and a.legacy:
                self.free_alloc(a)
        for it in p.ledger:
            if it.kind in ("vmm_handle", "imported_handle", "multicast"):
                obj = it.key
                if isinstance(obj, tuple) and obj[0] == "mem":
                    self.unref_alloc(self.allocs.get(obj[1]), all_refs=False)
                elif isinstance(obj, tuple) and obj[0] == "mc" and obj[1] in self.multicasts:
                    self.unref_multicast(self.multicasts[obj[1]])
        p.ledger.items.clear()
        # Nothing reaches an exited process's driver through the fabric any more (a pidfd
        # pull asks a live process only): dropping it breaks the fabric <-> driver cycle, so a
        # finished run's machine is freed by reference counting, not by the cyclic collector.
        self.drivers.pop(pid, None)
        return leaks

    # -- allocations ----------------------------------------------------------------------
    def new_alloc(self, gpu: GpuRef, size: int, legacy: bool, owner: int, handle_types: int = 0) -> PhysicalAlloc | None:
        """The new allocation, or None when the host cannot back `size` bytes (the caller
        answers out-of-memory, as the GPU would when full)."""
        try:
            data = self.memory.allocate(size, f"a{self._next_aid}")
        except MemoryError:
            return None
        a = PhysicalAlloc(self._next_aid, gpu, size, data, legacy, owner, handle_types)
        self._next_aid += 1
        self.allocs[a.aid] = a
        self._used[gpu] = self._used.get(gpu, 0) + size
        return a

    def free_alloc(self, a: PhysicalAlloc) -> None:
        a.freed = True
        if self.allocs.pop(a.aid, None) is not None:
            self._used[a.gpu] -= a.size
        self.memory.release(a.data, f"a{a.aid}")
        for h, (aid, pid) in list(self.ipc_handles.items()):
            if aid == a.aid:
                del self.ipc_handles[h]
                self.gone_ipc_handles[h] = (a.gpu, pid)

    def unref_alloc(self, a: PhysicalAlloc | None, all_refs: bool = False) -> None:
        """cuMemRelease semantics (row V13): memory goes when refs and mappings are both 0."""
        if a is None:
            return
        a.refs = 0 if all_refs else a.refs - 1
        if a.refs <= 0 and a.maps <= 0:
            self.free_alloc(a)

    def device_bytes_used(self, gpu: GpuRef) -> int:
        return self._used.get(gpu, 0)

    # -- handles as bytes -----------------------------------------------------------------
    def _blob(self, kind: bytes, *fields: int) -> bytes:
        # Kept per fabric: the bytes are a function of (kind, fields) and the fabric's seed,
        # and a handle is asked for again by every process an fd of it reaches.
        key = (kind, fields)
        blob = self._blobs.get(key)
        if blob is None:
            head = kind + struct.pack("<" + "Q" * len(fields), *fields)
            pad = hashlib.blake2b(head + struct.pack("<Q", self.seed), digest_size=64).digest()
            blob = self._blobs[key] = (head + pad)[:64]
        return blob

    def ipc_handle_for(self, a: PhysicalAlloc, pid: int) -> bytes:
        # Row L4: a new allocation at a recycled address gets a different handle, because the
        # handle encodes the allocation id, not the address.
        h = self._blob(b"CSIPCMEM", a.aid, pid)
        self.ipc_handles[h] = (a.aid, pid)
        return h

    def fabric_handle_for(self, kind: str, oid: int) -> bytes:
        h = self._blob(b"CSFABRIC" if kind == "mem" else b"CSFABMC_", oid)
        self.fabric_handles[h] = (kind, oid)
        return h

    # Lookups the driver makes when a handle arrives. Here every process shares this object;
    # process mode (commsim.sim.process_fabric) resolves the bytes against shared memory.
    def resolve_ipc_handle(self, key: bytes) -> tuple[int, int] | None:
        """(allocation id, exporter pid) of a legacy IPC handle, or None if unknown/freed."""
        return self.ipc_handles.get(key)

    def ipc_handle_origin(self, key: bytes) -> tuple[GpuRef, int] | None:
        """(GPU, exporter pid) a legacy IPC handle of freed memory names; None for bytes it never made."""
        return self.gone_ipc_handles.get(key)

    def resolve_fabric_handle(self, key: bytes) -> tuple[str, int] | None:
        """("mem"|"mc", id) of a FABRIC handle, or None if unknown."""
        return self.fabric_handles.get(key)

    # -- multicast ------------------------------------------------------------------------
    def new_multicast(self, creator: GpuRef, num_devices: int, size: int, handle_types: int) -> MulticastObject:
        m = MulticastObject(self._next_mid, creator, num_devices, size, handle_types)
        self._next_mid += 1
        self.multicasts[m.mid] = m
        return m

    def unref_multicast(self, m: MulticastObject) -> None:
        m.refs -= 1
        if m.refs <= 0 and m.maps <= 0:
            self.multicasts.pop(m.mid, None)
            for g, (a, _, _, _) in list(m.bindings.items()):  # its bindings go with it
                a.maps -= 1
                if a.refs <= 0 and a.maps <= 0:
                    self.free_alloc(a)
                # ... and so does the binding in the ledger of the process that made it:
                # otherwise an entry outlives its object and nothing can ever remove it.
                for p in self.processes.values():
                    if p.ledger.has("multicast_binding", (m.mid, str(g))):
                        p.ledger.remove("multicast_binding", (m.mid, str(g)), all_refs=True)
            m.bindings.clear()
            for h, (k, oid) in list(self.fabric_handles.items()):
                if k == "mc" and oid == m.mid:
                    del self.fabric_handles[h]

    def rule_on(self, row: str) -> bool:
        return row not in self.disabled_rules

    def flag(self, text: str) -> None:
        """Record an event the run must report. An event whose result is undefined (a plain
        access through a multicast address, MC7; an access to memory its exporter freed, L15;
        an unbind other than the binding, M6) says "undefined" in its text (is_undefined);
        the others are hazards (a free while peers map it, a FABRIC import outside its
        domain, an fd on the wrong host)."""
        self.flags.append(text if self.where is None else f"{text}, at {self.where()}")

    # -- ground truth queries used by the oracle (never by the communicator) -------------
    def live_bytes(self) -> int:
        return sum(a.size for a in self.allocs.values())
