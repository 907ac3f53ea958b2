"""SimDriver: one simulated process's view of CUDA and NVML over a SimFabric.

The calls are grouped by the rules they follow: identity, address space, legacy memory,
stream capture, NVML and kernels here; legacy IPC, VMM and multicast in the mixins
driver_ipc.py, driver_vmm.py and driver_multicast.py; the @api wrapper they all share in
driver_calls.py. Every method follows cuda-python's `(err, value...)` convention and returns the real codes;
misuse never raises. Each rule cites its row (L legacy IPC, V VMM, M multicast, F fabric info;
the rows' cases and public sources are tests/conformance/test_rules.py, the later rows
docs/fidelity-rules.md); the rows whose exact code is UNCONFIRMED take it from
`unconfirmed.UNCONFIRMED`.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from typing import Any, Callable, Sequence

import numpy as np

from commsim.driver import FD, NVML_P2P_STATUS_NOT_SUPPORTED, NVML_P2P_STATUS_OK, GpuFabricInfo
from commsim.topology.model import GpuRef
from commsim.sim import real_fds, shm, unconfirmed
from commsim.sim.driver_calls import A, E, R, VA_ALIGN, Fail, Mapping, Refusal, _attr_int, api
from commsim.sim.driver_ipc import LegacyIpcCalls
from commsim.sim.driver_multicast import MulticastCalls
from commsim.topology.model import MULTICAST_SINCE_BRANCH
from commsim.sim.driver_vmm import VmmCalls
from commsim.sim.faults import ProcessFaults
from commsim.sim.fabric import MulticastObject, PhysicalAlloc, SimFabric, SimProcess
from commsim.sim.kernel_context import SimKernelContext
from commsim.sim.p2p_probe import probe_pair
from commsim.sim.stream_capture import StreamCapture

__all__ = ["SimDriver", "spawn_driver", "Fail", "Mapping", "api", "E", "R", "FD"]

_MEMSET_CHUNK = 1 << 20      # bytes of pattern a cuMemsetD* builds at most, whatever its count


# cuDeviceGetAttribute: attribute -> how the GPU's model answers it (built once: the enum
# lookups cost more than the answer, and discovery asks every rank several).
_DEVICE_ATTRIBUTES: dict[int, Callable[[Any], Any]] = {
    int(A.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED): lambda g: g.vmm,
    int(A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED): lambda g: g.posix_fd,
    int(A.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED): lambda g: g.gpu_direct_rdma,
    int(A.CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED): lambda g: g.ipc_event,
    int(A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED): lambda g: g.fabric_handle,
    int(A.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED): lambda g: g.multicast,
    int(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR): lambda g: g.compute_capability[0],
    int(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR): lambda g: g.compute_capability[1],
    int(A.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING): lambda g: 1,
}
_MULTICAST_ATTR = int(A.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)


class SimDriver(LegacyIpcCalls, VmmCalls, MulticastCalls):
    """The Driver protocol for one simulated process (see commsim/driver.py)."""

    refusal: Refusal | None = None

    def __init__(self, fabric: SimFabric, proc: SimProcess):
        self.fabric = fabric
        self.proc = proc
        self.refusal: Refusal | None = None          # why the last failing call failed (@api)
        # The process's ledger, as a plain attribute: a few hundred reads per scenario. A
        # process keeps its ledger for life (ProcessFabric.spawn swaps it in before a driver
        # exists).
        self.ledger = proc.ledger
        self.cluster = fabric.cluster
        # The process's own host (immutable, as the cluster is): NVML and identity calls ask it.
        self._host = fabric.cluster.host(proc.host)
        self._maps: dict[int, Mapping] = {}
        self._bases: list[int] = []
        self._reserved: dict[int, int] = {}           # VA reservations: base -> size
        self._rbases: list[int] = []                  # their bases, sorted (bisect lookups)
        self._next_va = 0x7F00_0000_0000 + (proc.pid % 4096) * (1 << 34)
        self._handles: dict[int, tuple[str, int]] = {}  # VMM handle -> ("mem"|"mc", id)
        self._next_handle = 0x1000 + (proc.pid % 997) * 16
        self._fds = real_fds.table_for(self)          # POSIX-fd handles: real OS fds
        self._ipc_open: dict[int, int] = {}           # aid -> base of our import
        # Allocations this process gave a legacy IPC handle for: only those can have
        # importers, so only their cudaFree asks every process (row L15).
        self._ipc_exported: set[int] = set()
        self._peer_maps = 0
        self.capture = StreamCapture()                # the workload's CUDA-graph capture
        self._graphs = 0
        fabric.exit_hooks[proc.pid] = self._exit_release
        fabric.drivers[proc.pid] = self
        fabric.pre_exit_hooks[proc.pid] = lambda: real_fds.reap_at_exit(self)

    def _exit_release(self) -> None:
        """The OS ends this process: its VMM and multicast mappings and its multicast
        bindings go away, so memory no other process holds is freed (SimFabric.exit_process)."""
        for m in list(self._maps.values()):
            if m.kind in ("vmm", "mc"):
                self._del_map(m)
                obj = m.target
                obj.maps -= 1
                if obj.refs <= 0 and obj.maps <= 0:
                    if isinstance(obj, PhysicalAlloc):
                        self.fabric.free_alloc(obj)
                    else:
                        self.fabric.unref_multicast(obj)
        for fd in list(self._fds):      # the OS closes every fd of an exiting process
            self.close_fd(fd)
        for it in self.ledger:
            if it.kind == "multicast_binding":
                mid, gname = it.key
                mc = self.fabric.multicasts.get(mid)
                for g, (a, _, _, _) in list(mc.bindings.items()) if mc else ():
                    if str(g) == gname:
                        del mc.bindings[g]
                        a.maps -= 1
                        if a.refs <= 0 and a.maps <= 0:
                            self.fabric.free_alloc(a)

    # ---- identity ---------------------------------------------------------------------
    @property
    def device(self) -> GpuRef:
        return self.proc.gpus[self.proc.current]

    def gethostname(self) -> str:
        return self.proc.host

    def getpid(self) -> int:
        return self.proc.pid

    def uts_hostname(self) -> str:
        """What gethostname(2) answers in this process: its host's name, unless the process
        has a UTS namespace of its own (a container per process; `gethostname` above stays
        the simulated host, the key every model finds the host by)."""
        return self._host.process_hostname(self.proc.pid)

    def imex_channels(self) -> tuple[int, ...]:
        """IMEX channels this process can open: configured on its host and the device node
        present in its container (rows I1, W5)."""
        return self._host.usable_imex_channels

    def shm_namespace(self) -> str:
        """What vLLM's same-node test observes: hosts that share /dev/shm;
        a process in a container of its own has its own (row W6)."""
        return self._host.process_namespace(self.proc.pid)

    def shm_dir(self) -> str | None:
        """The directory standing in for this process's /dev/shm where the run's ranks are OS
        processes (process mode: one per shm namespace, inside the run's private directory,
        so every process of the namespace sees the same files); None where the ranks share
        one Python process and a library keeps its segments in memory."""
        prefix = getattr(self.fabric, "prefix", None)
        if prefix is None:
            return None
        ns = hashlib.sha256(self.shm_namespace().encode()).hexdigest()[:16]
        path = shm.segment_path(prefix, f"devshm-{ns}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        return str(path)

    def _dev(self, ordinal: Any, runtime: bool = False) -> GpuRef:
        o = ordinal if type(ordinal) is int else _attr_int(ordinal)   # a struct field may be anything
        if not 0 <= o < len(self.proc.gpus):
            raise Fail(E.cudaErrorInvalidDevice if runtime else R.CUDA_ERROR_INVALID_DEVICE)
        return self.proc.gpus[o]

    @api(1, True)
    def cudaGetDeviceCount(self) -> int:
        return len(self.proc.gpus)

    @api(1, True)
    def cudaGetDevice(self) -> int:
        return self.proc.current

    @api(0, True)
    def cudaSetDevice(self, device: int) -> None:
        self._dev(device, runtime=True)
        self.proc.current = int(device)

    @api(0, True)
    def cudaDeviceSynchronize(self) -> None:
        return None  # simulated kernels complete at launch

    @api(1, False)
    def cuDeviceGetAttribute(self, attrib: Any, dev: int) -> int:
        g = self.cluster.gpu(self._dev(dev))
        read = _DEVICE_ATTRIBUTES.get(attrib)
        if read is None or (attrib == _MULTICAST_ATTR and self.cluster.driver_major(
                self.proc.host) < MULTICAST_SINCE_BRANCH):
            # an attribute this driver does not know (row M9 for multicast's, attribute 132)
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return int(read(g))

    def _can_access(self, a: GpuRef, b: GpuRef) -> bool:
        return self.cluster.p2p(a, b)

    def p2p_probe(self, gpu: int, peer: int) -> str | None:
        """The functional P2P probe (row P4, sim/p2p_probe.py) between two GPUs of this host
        by NVML index (helper processes choose their own visible devices, as vLLM's do): ""
        when an IPC round trip from `gpu` into `peer` keeps its bytes, else what failed.

        In process mode (one OS process per rank, a fabric over shared memory) the helper
        processes share only the machine with the ranks, so their round trip runs in a private
        fabric over the same cluster, made once per rank process: its verdict is the one the
        shared fabric would give (sim/p2p_probe.py: it reads only the machine), except that a
        peer GPU too full for the probe's buffer is not seen from there (not modelled)."""
        refs = self._nvml_refs()
        if not (0 <= gpu < len(refs) and 0 <= peer < len(refs)):
            return None
        fabric = self.fabric
        if type(fabric) is not SimFabric:
            own = fabric.__dict__.get("_probe_fabric")
            if own is None:
                own = fabric.__dict__["_probe_fabric"] = SimFabric(
                    self.cluster, disabled_rules=fabric.disabled_rules)
            fabric = own
        return probe_pair(fabric, refs[gpu], refs[peer], spawn_driver)

    def _nvml_refs(self) -> Sequence[GpuRef]:
        """The GPUs NVML enumerates in this process, NVML index i -> result[i]: the host's,
        or its container's device cgroup (row W3, sim/visibility.py)."""
        if self.proc.container is not None:
            return self.proc.container
        return self.cluster.gpu_refs_of(self.proc.host)

    def nvml_index(self, ordinal: int) -> int:
        """The NVML index of a CUDA ordinal (what nvmlDeviceGetHandleByPciBusId of the
        device's bus id gives): the GPU's place among the GPUs NVML enumerates (the host's,
        or the container's), whatever CUDA_VISIBLE_DEVICES remapped (rows W1, W3)."""
        g = self.proc.gpus[ordinal]
        return g.index if self.proc.container is None else self.proc.container.index(g)

    def nvml_host_index(self, index: int) -> int:
        """The host index of the GPU at NVML `index`: what its PCI bus id identifies across
        processes whose containers number their GPUs differently (row W3)."""
        return self._nvml_refs()[index].index

    def host_gpu_count(self) -> int:
        """How many GPUs the host has: only the width of facts kept by host index (a process
        in a container cannot read it; what lies outside its container stays unknown)."""
        return len(self._host.gpus)

    def nvmlDeviceGetCount(self) -> tuple:
        """NVML sees every GPU of the host, or of the container's device cgroup;
        CUDA_VISIBLE_DEVICES does not apply (rows W1, W3)."""
        return (0, len(self._nvml_refs()))

    @api(1, False)
    def cuDeviceCanAccessPeer(self, dev: int, peer_dev: int) -> int:
        return int(self._can_access(self._dev(dev), self._dev(peer_dev)))

    @api(1, True)
    def cudaDeviceCanAccessPeer(self, device: int, peer_device: int) -> int:
        return int(self._can_access(self._dev(device, True), self._dev(peer_device, True)))

    # ---- virtual address space ----------------------------------------------------------
    def _va(self, size: int, align: int = VA_ALIGN) -> int:
        align = max(align, VA_ALIGN)
        base = (self._next_va + align - 1) // align * align
        self._next_va = base + max(size, 1) + VA_ALIGN   # a gap, so off-by-one reads fault
        return base

    def _add_map(self, m: Mapping) -> None:
        self._maps[m.base] = m
        bisect.insort(self._bases, m.base)

    def _del_map(self, m: Mapping) -> None:
        del self._maps[m.base]
        self._bases.pop(bisect.bisect_left(self._bases, m.base))

    def _find(self, ptr: int) -> tuple[Mapping, int] | None:
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0:
            return None
        m = self._maps[self._bases[i]]
        off = ptr - m.base
        return (m, off) if off < m.size else None

    def resolve(self, ptr: int, nbytes: int) -> tuple[Mapping, int]:
        """Mapping and offset for a device access of `nbytes` at `ptr`; Fail(700) when the
        range is unmapped, has no access (row V11) or its memory was freed (row L15)."""
        # _find inlined: kernels resolve every peer pointer of every round (the hot path).
        ptr = ptr if type(ptr) is int else _attr_int(ptr)
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0 or nbytes < 0:
            raise Fail(E.cudaErrorIllegalAddress)
        m = self._maps[self._bases[i]]
        off = ptr - m.base
        if off + nbytes > m.size or off >= m.size:
            raise Fail(E.cudaErrorIllegalAddress)
        if not m.access:
            raise Fail(E.cudaErrorIllegalAddress)
        if isinstance(m.target, PhysicalAlloc) and m.target.freed:
            self.fabric.flag(f"pid {self.proc.pid}: access to memory its exporter freed while "
                             f"mapped (undefined behaviour, row L15)")
            raise Fail(E.cudaErrorIllegalAddress)
        return m, off

    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        """Raw bytes behind a unicast device range (for simulated kernels and memcpy)."""
        m, off = self.resolve(ptr, nbytes)
        if m.kind == "mc":
            # Row MC7: only multimem.* is valid on a multicast address (PTX ISA); a plain
            # load/store is undefined, not an error code: flagged, and it reaches no memory.
            self.fabric.flag(f"pid {self.proc.pid}: plain load/store through multicast address "
                             f"{hex(_attr_int(ptr))}: undefined result (row MC7)")
            return np.zeros(nbytes, dtype=np.uint8)
        a = m.target
        start = m.offset + off
        if start + nbytes > a.data.size:
            raise Fail(E.cudaErrorIllegalAddress)   # past the bytes behind it (0-byte malloc)
        live = a.data[start:start + nbytes]
        if self.fabric.unreal_p2p:          # only then can a peer path lose writes (row P3)
            bad = self._bad_peer_path(a)
            if bad:
                return self._unreal_p2p(live, bad)
        return live

    def _bad_peer_path(self, a: PhysicalAlloc) -> str:
        """How peer accesses to `a` from this process's device fail when P2P is reported but
        not real (row P3): "dropped", "corrupt", or "" for a sound path."""
        me = self.device
        if not self.fabric.unreal_p2p or a.gpu == me or a.gpu.host != me.host:
            return ""
        lk = self.cluster.host(me.host).link(me.index, a.gpu.index)
        return lk.lost_writes

    @staticmethod
    def _unreal_p2p(live: np.ndarray, how: str) -> np.ndarray:
        """Row P3 (patched P2P on consumer boards): every call succeeds, but what is written
        through the peer mapping never lands ("dropped": reads see the real bytes) or lands
        garbled ("corrupt": data-sized accesses see and leave garbage, while 4-byte flag
        accesses still arrive, as the reports show wrong data rather than hangs). The access
        granularity of the corruption is UNCONFIRMED."""
        if how == "corrupt" and live.size <= 4:
            return live
        copy = live.copy()
        if how == "corrupt":
            copy ^= 0x5A
        return copy

    def multimem_views(self, ptr: int, nbytes: int) -> list[np.ndarray]:
        """The bound unicast bytes behind a multicast range, one per team device, in join order.
        Row MC6: multimem over an address that is 0, not a multicast mapping or not bound is an
        illegal address, and it is sticky: the context is unusable from then on."""
        try:
            return self._multimem_views(ptr, nbytes)
        except Fail as f:
            if f.code == E.cudaErrorIllegalAddress:
                self.proc.sticky = E.cudaErrorIllegalAddress
            raise

    def _multimem_views(self, ptr: int, nbytes: int) -> list[np.ndarray]:
        m, off = self.resolve(ptr, nbytes)
        if m.kind != "mc":
            raise Fail(E.cudaErrorIllegalAddress)
        mc: MulticastObject = m.target
        out = []
        for g in mc.devices:
            b = mc.bindings.get(g)
            if b is None:
                raise Fail(E.cudaErrorIllegalAddress)
            alloc, mem_off, mc_off, size = b
            lo = off - mc_off
            if lo < 0 or lo + nbytes > size:
                raise Fail(E.cudaErrorIllegalAddress)
            out.append(alloc.data[mem_off + lo: mem_off + lo + nbytes])
        return out

    # ---- legacy memory --------------------------------------------------------------------
    @api(1, True)
    def cudaMalloc(self, size: int) -> int:
        if size < 0:
            raise Fail(E.cudaErrorInvalidValue)
        g = self.device
        if self.bytes_used(g) + size > self.cluster.gpu(g).memory_bytes:
            raise Fail(E.cudaErrorMemoryAllocation)
        a = self.fabric.new_alloc(g, size, legacy=True, owner=self.proc.pid)
        if a is None:
            raise Fail(E.cudaErrorMemoryAllocation)   # the host cannot back it
        base = self._va(size)
        self._add_map(Mapping(base, max(size, 1), "malloc", a))
        self.ledger.add("allocation", base, "cudaMalloc({}) on {}", size, g)
        return base

    @api(0, True)
    def cudaFree(self, dev_ptr: int) -> None:
        p = dev_ptr
        if p == 0:
            return None   # cudaFree(0) is a no-op by the runtime's contract
        m = self._maps.get(p)
        if m is None or m.kind != "malloc":
            raise Fail(E.cudaErrorInvalidValue)
        self._free_malloc(m)

    def _free_malloc(self, m: Mapping) -> None:
        p = m.base
        a: PhysicalAlloc = m.target
        importers = [q for q in self.fabric.processes.values()
                     if q.pid != self.proc.pid and q.ledger.has("ipc_mapping", ("aid", a.aid))
                     ] if a.aid in self._ipc_exported else []
        if importers and self.fabric.rule_on("L15"):
            # Row L15: freeing while peers still map it is undefined; poisoned for them.
            self.fabric.flag(f"pid {self.proc.pid} freed {hex(p)} while pids "
                             f"{', '.join(str(q.pid) for q in importers)} still had it open (row L15, "
                             f"close-before-free G7)")
        self._del_map(m)
        self.fabric.free_alloc(a)
        self.ledger.remove("allocation", p, all_refs=True)

    # ---- device reset -----------------------------------------------------------------------
    # cudaDeviceReset (CUDA Runtime API, cuda_runtime_api.h, CUDA 13.0): "Explicitly destroys and
    # cleans up all resources associated with the current device in the current process. Any
    # subsequent API call to this device will reinitialize the device." cuDevicePrimaryCtxReset
    # (CUDA Driver API, cuda.h, CUDA 13.0) does the same for the primary context of `dev`, and
    # "resetting the primary context does not release it" (the retain count is the hosted
    # context's, unchanged). The runtime's reset is the driver's over the current device.
    @api(0, True)
    def cudaDeviceReset(self) -> None:
        self._reset_device(self.device)

    @api(0, False)
    def cuDevicePrimaryCtxReset(self, dev: int) -> None:
        self._reset_device(self._dev(dev))

    def _reset_device(self, g: GpuRef) -> None:
        """Free this process's cudaMalloc allocations on `g` (as cudaFree does, row L15
        included: an importer still mapping one sees it poisoned) and close every legacy IPC
        mapping opened in `g`'s context, all its references at once. UNCONFIRMED: VMM and
        multicast mappings (cuMemMap; the reservation and handles are the process's, not the
        context's) and exported handles of other processes' memory are left as they are; the
        docs name neither."""
        for m in list(self._maps.values()):
            if m.kind == "malloc" and m.target.gpu == g:
                self._free_malloc(m)
            elif m.kind == "ipc" and m.device == g:
                self._close_ipc(m, 0)

    def _memcpy_check(self, count: int) -> int:
        if count < 0:
            raise Fail(E.cudaErrorInvalidValue)
        return count

    @api(0, True)
    def cudaMemcpy(self, dst: int, src: int, count: int, kind: Any) -> None:
        c = self._memcpy_check(count)
        if c == 0:
            return None
        try:
            d = self.view(dst, c)
            s = self.view(src, c)
        except Fail:
            raise Fail(E.cudaErrorInvalidValue)  # runtime validates pointers before launch
        np.copyto(d, s)

    @api(0, True)
    def cudaMemset(self, dev_ptr: int, value: int, count: int) -> None:
        c = self._memcpy_check(count)
        try:
            self.view(dev_ptr, c)[:] = value & 0xFF
        except Fail:
            raise Fail(E.cudaErrorInvalidValue)

    @api(0, True)
    def memcpy_htod(self, dst: int, host: np.ndarray) -> None:
        """cudaMemcpy(dst, host, nbytes, HostToDevice) with the host side as an array. A host
        object that has no plain bytes (an object array, a str) is an invalid value."""
        try:
            b = np.ascontiguousarray(host)
            if b.dtype.hasobject:
                raise TypeError("object array")
            b = b.view(np.uint8).reshape(-1)
        except (TypeError, ValueError):
            raise Fail(E.cudaErrorInvalidValue)
        try:
            self.fabric.memory.copy_in(self.view(dst, b.size), b)
        except Fail:
            raise Fail(E.cudaErrorInvalidValue)

    @api(1, True)
    def memcpy_dtoh(self, src: int, nbytes: int) -> np.ndarray:
        try:
            return self.fabric.memory.read_copy(self.view(src, self._memcpy_check(nbytes)))
        except Fail:
            raise Fail(unconfirmed.OUT_OF_RANGE_COPY)

    @api(0, True)
    def copy_range(self, ptr: int, nbytes: int) -> None:
        """The check a copy makes before it moves a byte: `nbytes` bytes from `ptr` lie in one
        mapping (cuMemcpyHtoD makes it before reading its host buffer, as DtoH and DtoD do)."""
        try:
            self.resolve(ptr, self._memcpy_check(nbytes))
        except Fail:
            raise Fail(unconfirmed.OUT_OF_RANGE_COPY)

    @api(0, True)
    def memset_d(self, dst: int, value: int, count: int, width: int) -> None:
        """cuMemsetD8/16/32: `count` elements of `width` bytes set to `value`. The range is
        checked before anything is built and the pattern written a chunk at a time, so a
        huge count answers at once and any count costs bounded host memory."""
        n = self._memcpy_check(count) * width
        if n == 0:
            return None
        try:
            view = self.view(dst, n)
        except Fail:
            raise Fail(unconfirmed.OUT_OF_RANGE_COPY)
        chunk = np.full(min(count, _MEMSET_CHUNK // width), value,
                        dtype=np.dtype(f"<u{width}")).view(np.uint8)
        for lo in range(0, n, chunk.size):
            part = view[lo:lo + chunk.size]
            self.fabric.memory.copy_in(part, chunk[:part.size])

    # ---- stream capture (commsim/sim/stream_capture.py, rules CG1-CG4) ---------------------
    # The stream is the rank's one capturing stream: the argument is taken, not modelled.
    @api(0, True)
    def cudaStreamBeginCapture(self, stream: Any, mode: Any) -> None:
        err = self.capture.begin(mode)
        if err is not None:
            raise Fail(err)

    @api(1, True)
    def cudaStreamEndCapture(self, stream: Any) -> int:
        err = self.capture.end()
        if err is not None:
            raise Fail(err)          # CG2: an invalidated capture gives no graph
        self._graphs += 1
        return self._graphs

    @api(1, True)
    def cudaThreadExchangeStreamCaptureMode(self, mode: Any) -> Any:
        old = self.capture.exchange(mode)
        if old is None:
            raise Fail(E.cudaErrorInvalidValue)
        return old

    # ---- NVML --------------------------------------------------------------------------------
    def _nvml_gpu(self, index: int):
        if type(index) is int:
            i = index
        else:
            i = _attr_int(index) if isinstance(index, int) or hasattr(index, "__index__") else -1
        refs = self._nvml_refs()
        if not 0 <= i < len(refs):
            return None
        return self._host.gpus[refs[i].index]

    def nvmlDeviceGetGpuFabricInfo(self, index: int) -> tuple:
        g = self._nvml_gpu(index)
        if g is None:
            return (2, None)   # NVML_ERROR_INVALID_ARGUMENT
        f = g.fabric
        return (0, GpuFabricInfo(f.cluster_uuid, f.status, f.clique_id, int(f.state)))

    def nvmlDeviceGetP2PStatus(self, index1: int, index2: int) -> tuple:
        """NVML_P2P_CAPS_INDEX_NVLINK status, what vLLM's `is_fully_connected` reads."""
        h = self._host
        a, b = self._nvml_gpu(index1), self._nvml_gpu(index2)
        if a is None or b is None:
            return (2, None)
        if a.index == b.index:
            return (0, NVML_P2P_STATUS_OK)
        lk = h.link(a.index, b.index)
        # Rows N1/N2: NVML's NVLink P2P capability stays true to the links (P2P disabled with
        # links up still reads OK); links down read NOT_SUPPORTED even where PCIe P2P works.
        up = lk.is_nvlink and a.nvlinks_up and b.nvlinks_up
        return (0, NVML_P2P_STATUS_OK if up else NVML_P2P_STATUS_NOT_SUPPORTED)

    def pci_path(self, index1: int, index2: int) -> str:
        """The PCIe path between two GPUs of this host by NVML index, as `nvidia-smi topo -m`
        names it (PIX, PXB, PHB, NODE, SYS; "" for one GPU or an unknown index): what NCCL's
        topology detection reads from sysfs (src/graph/topo.cc, the PCI tree under
        /sys/bus/pci). An NVLink pair's PCIe path is not in the model: SYS."""
        a, b = self._nvml_gpu(index1), self._nvml_gpu(index2)
        if a is None or b is None or a.index == b.index:
            return ""
        lk = self._host.link(a.index, b.index)
        return "SYS" if lk.is_nvlink else lk.kind

    def nvmlDeviceGetNvLinkState(self, index: int) -> tuple:
        """Whether every P2P-capable NVLink of the GPU is active (FlashInfer / TRT-LLM check it)."""
        g = self._nvml_gpu(index)
        if g is None:
            return (2, None)
        return (0, bool(g.nvlinks_up))

    def nvml_nvlink_reach(self, index: int) -> tuple[bool, ...] | None:
        """Per host index, whether the GPU at NVML `index` reaches that GPU over its active
        NVLinks, as the far ends' PCI bus ids of its own links name them
        (nvmlDeviceGetNvLinkRemotePciInfo: a peer, or an NVSwitch every switched GPU links
        to), link by link as NCCL's topology detection reads them (src/graph/xml.cc
        ncclTopoGetXmlFromGpu, NVIDIA/nccl v2.27.3-1: each P2P-capable link that is active
        counts): a GPU's own links are readable whatever its container holds (row W3), so this
        names GPUs outside it too. None for an index NVML does not have."""
        g = self._nvml_gpu(index)
        if g is None:
            return None
        h, ref = self._host, GpuRef(self._host.name, g.index)
        switched = self.cluster.domain_of(ref) is not None

        def active(a: int, b: int) -> int:
            # The links of a and b that are up. A GPU whose links are not all up has its
            # link 0 inactive, as the hosted NVML answers per link (which link is down is
            # UNCONFIRMED: the model says only "not all"); its link 0 goes to a switch on a
            # switched board, else to its lowest-index NVLink peer.
            n = h.link(a, b).nvlinks
            for x, y in ((a, b), (b, a)):
                if not h.gpus[x].nvlinks_up and (switched and x == a or not switched and y == min(
                        k for k in range(len(h.gpus)) if k != x and h.link(x, k).is_nvlink)):
                    n -= 1
            return n

        return tuple(k != g.index and h.link(g.index, k).is_nvlink and active(g.index, k) > 0
                     for k in range(len(h.gpus)))

    # ---- kernels ------------------------------------------------------------------------------
    @api(0, True)
    def launch_kernel(self, kernel: Callable[..., None], *args: Any) -> None:
        """Run a reference kernel (commsim/kernels/) on the current device. A fault inside it
        (unmapped, no access, freed memory) is cudaErrorIllegalAddress (700)."""
        kernel(SimKernelContext(self), *args)


def spawn_driver(fabric: SimFabric, gpu, faults: ProcessFaults | None = None,
                 visible=None, container=None) -> SimDriver:
    """A process on `gpu`'s host, current device = `gpu`. By default it sees every GPU of that
    host (how vLLM/sglang workers run: all GPUs visible, torch.cuda.set_device(local_rank));
    `visible` is its CUDA_VISIBLE_DEVICES as host GPU indices, in order: ordinals are
    remapped to that list (row W1; e.g. one GPU per process as Ray places trays).
    `container`: the host GPU indices its container's device cgroup allows (row W3), which
    NVML enumerates in host order; the visible list must lie within them."""
    refs = fabric.cluster.gpu_refs_of(gpu.host)
    if visible is None:
        order = [g.index for g in refs] if container is None else sorted(container)
    else:
        order = list(visible)
    seen = [type(gpu)(gpu.host, i) for i in order]
    if gpu.index not in order:
        raise ValueError(f"{gpu} is not among the visible devices {order}")
    if container is not None and not set(order) <= set(container):
        raise ValueError(f"visible devices {order} are not all in the container's {sorted(container)}")
    proc = fabric.spawn(gpu.host, seen, faults)
    if container is not None:
        proc.container = tuple(type(gpu)(gpu.host, i) for i in sorted(container))
    proc.current = order.index(gpu.index)
    return SimDriver(fabric, proc)
