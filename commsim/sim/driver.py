"""SimDriver: one simulated process's view of CUDA and NVML over a SimFabric.

Every method follows cuda-python's `(err, value...)` convention and returns the real codes;
misuse never raises. Each rule cites its row in shared/reference/domain.md §9; the rows whose
exact code is UNCONFIRMED take it from `unconfirmed.UNCONFIRMED`.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart

from ..driver import (FABRIC, FD, LAZY_ENABLE_PEER_ACCESS, NVML_P2P_STATUS_NOT_SUPPORTED, NVML_P2P_STATUS_OK,
                      GpuFabricInfo)
from ..runtime.scheduler import wait_until
from ..topology.model import FabricState, GpuRef
from . import binding_args, real_fds, unconfirmed
from .fabric import MulticastObject, PhysicalAlloc, SimFabric, SimProcess
from .fd_channel import SimFdChannel
from .kernel_context import SimKernelContext
from .stream_capture import StreamCapture

E = cudart.cudaError_t
R = cu.CUresult
A = cu.CUdevice_attribute
VA_ALIGN = 512          # cudaMalloc alignment seen in practice is >= 256 B


class Fail(Exception):
    """Internal: abort the current call with this code (caught by @api, never escapes)."""

    def __init__(self, code: Any):
        self.code = code


def api(nvals: int, runtime: bool):
    """Wrap a driver method: faults first, then the body; a Fail becomes `(code, None...)`."""
    ok = E.cudaSuccess if runtime else R.CUDA_SUCCESS

    def deco(fn: Callable) -> Callable:
        name = fn.__name__

        @functools.wraps(fn)
        def wrapper(self: "SimDriver", *args: Any) -> tuple:
            # What cuda-python's wrapper rejects while converting arguments, rejected the same
            # way (an exception, before anything else); what converts gets a code below.
            args = binding_args.convert(name, args)
            if not self.proc.alive:
                return (E.cudaErrorCudartUnloading if runtime else R.CUDA_ERROR_DEINITIALIZED,) + (None,) * nvals
            if self.proc.sticky is not None:
                # A sticky error (row MC6) answers every later call of the context with itself.
                return (self.proc.sticky if runtime else R.CUDA_ERROR_ILLEGAL_ADDRESS,) + (None,) * nvals
            forced = self.proc.faults.before(name)
            if forced is not None:
                return (forced,) + (None,) * nvals
            # Rules CG1-CG3 (stream_capture.py): a call the runtime refuses during a capture.
            refused = self.capture.refused(name)
            if refused is not None:
                return (refused,) + (None,) * nvals
            try:
                out = fn(self, *args)
            except Fail as f:
                return (f.code,) + (None,) * nvals
            if nvals == 0:
                return (ok,)
            return (ok, out) if nvals == 1 else (ok,) + tuple(out)
        return wrapper
    return deco


@dataclass(eq=False)
class Mapping:
    base: int
    size: int
    kind: str                       # "malloc" | "ipc" | "vmm" | "mc"
    target: PhysicalAlloc | MulticastObject
    offset: int = 0
    access: bool = True
    refs: int = 1
    handle: int | None = None       # process-local VMM handle it was mapped from


def _attr_int(x: Any) -> int:
    """An int read from a struct field or an already converted argument; -1 (which every rule
    refuses) for anything that is no finite number."""
    try:
        return int(x)
    except (TypeError, ValueError, OverflowError):
        return -1


def _prop_handle_types(prop: Any) -> int:
    """`prop.requestedHandleTypes` as an int. cuda-python's setter takes any mask, but its
    getter raises ValueError for one that is no single enum member (FD|FABRIC, the "ANY" mode
    of §2.2); then the raw field is read (CUmemAllocationProp: type, requestedHandleTypes,
    both 32-bit, per cuda.h)."""
    try:
        return _attr_int(getattr(prop, "requestedHandleTypes", 0))
    except ValueError:
        try:
            return int(ctypes.c_uint32.from_address(prop.getPtr() + 4).value)
        except Exception:
            return -1


def _handle_bytes(x: Any, attr: str) -> bytes | None:
    """The first 64 bytes of a handle blob (bytes-like, a cuda-python handle with `attr`, or
    a ctypes struct), or None when `x` is no blob. Numbers are refused: `bytes(n)` would
    build n zero bytes (a garbage pointer passed as a handle must give an error code)."""
    x = getattr(x, attr, x)
    if x is None or isinstance(x, (int, float, complex, str)):
        return None
    try:
        return bytes(memoryview(x))[:64]
    except (TypeError, ValueError, BufferError):
        return None


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


class SimDriver:
    """The Driver protocol for one simulated process (see commsim/driver.py)."""

    def __init__(self, fabric: SimFabric, proc: SimProcess):
        self.fabric = fabric
        self.proc = proc
        self.cluster = fabric.cluster
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
    def ledger(self):
        return self.proc.ledger

    @property
    def device(self) -> GpuRef:
        return self.proc.gpus[self.proc.current]

    def gethostname(self) -> str:
        return self.proc.host

    def getpid(self) -> int:
        return self.proc.pid

    def imex_channels(self) -> tuple[int, ...]:
        """IMEX channels this process can open: configured on its host and the device node
        present in its container (rows I1, W5)."""
        return self.cluster.host(self.proc.host).usable_imex_channels

    def shm_namespace(self) -> str:
        """What vLLM's same-node test observes: hosts that share /dev/shm (reference §4.3);
        a process in a container of its own has its own (row W6)."""
        return self.cluster.host(self.proc.host).process_namespace(self.proc.pid)

    def _dev(self, ordinal: Any, runtime: bool = False) -> GpuRef:
        o = _attr_int(ordinal)
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
        read = _DEVICE_ATTRIBUTES.get(_attr_int(attrib))
        if read is None:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return int(read(g))

    def _can_access(self, a: GpuRef, b: GpuRef) -> bool:
        return self.cluster.p2p(a, b)

    def p2p_probe(self, gpu: int, peer: int) -> str | None:
        """The functional P2P probe (row P4, sim/p2p_probe.py) between two GPUs of this host
        by NVML index (helper processes choose their own visible devices, as vLLM's do): ""
        when an IPC round trip from `gpu` into `peer` keeps its bytes, else what failed; None
        where helper processes cannot be started (process mode: one OS process per rank)."""
        if type(self.fabric) is not SimFabric:
            return None
        h = self.cluster.host(self.proc.host)
        if not (0 <= gpu < len(h.gpus) and 0 <= peer < len(h.gpus)):
            return None
        from .p2p_probe import probe_pair
        return probe_pair(self.fabric, GpuRef(h.name, gpu), GpuRef(h.name, peer))

    def nvml_index(self, ordinal: int) -> int:
        """The NVML index of a CUDA ordinal (what nvmlDeviceGetHandleByPciBusId of the
        device's bus id gives): the GPU's index on its host, whatever CUDA_VISIBLE_DEVICES
        remapped (row W1)."""
        return self.proc.gpus[ordinal].index

    def nvmlDeviceGetCount(self) -> tuple:
        """NVML sees every GPU of the host; CUDA_VISIBLE_DEVICES does not apply (row W1)."""
        return (0, len(self.cluster.host(self.proc.host).gpus))

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
        return "" if lk.peer_writes == "ok" else lk.peer_writes

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
        size = _attr_int(size)
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
        self.ledger.add("allocation", base, f"cudaMalloc({size}) on {g}")
        return base

    @api(0, True)
    def cudaFree(self, dev_ptr: int) -> None:
        p = _attr_int(dev_ptr)
        if p == 0:
            return None   # cudaFree(0) is a no-op by the runtime's contract
        m = self._maps.get(p)
        if m is None or m.kind != "malloc":
            raise Fail(E.cudaErrorInvalidValue)
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

    def _memcpy_check(self, count: int) -> int:
        c = _attr_int(count)
        if c < 0:
            raise Fail(E.cudaErrorInvalidValue)
        return c

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
            self.view(dev_ptr, c)[:] = _attr_int(value) & 0xFF
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
            raise Fail(E.cudaErrorInvalidValue)

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

    # ---- legacy IPC -----------------------------------------------------------------------
    @api(1, True)
    def cudaIpcGetMemHandle(self, dev_ptr: int) -> bytes:
        hit = self._find(_attr_int(dev_ptr))
        if hit is None:
            raise Fail(E.cudaErrorInvalidValue)
        m, off = hit
        if m.kind != "malloc":
            raise Fail(E.cudaErrorInvalidValue)        # rows L2, H4: VMM memory has no legacy handle
        # Rows L3/H3: a pointer inside the allocation gives the handle of its base (identical
        # bytes, openucx/ucx#11724); the importer adds the offset itself (RANGE_START_ADDR).
        self._ipc_exported.add(m.target.aid)
        return self.fabric.ipc_handle_for(m.target, self.proc.pid)   # rows L1, L4

    @api(1, True)
    def cudaIpcOpenMemHandle(self, handle: Any, flags: int) -> int:
        if _attr_int(flags) != int(LAZY_ENABLE_PEER_ACCESS):
            raise Fail(unconfirmed.code("L13"))
        key = _handle_bytes(handle, "reserved")
        entry = self.fabric.resolve_ipc_handle(key) if key is not None else None
        if entry is None:
            raise Fail(unconfirmed.code("H5"))   # unknown, or its memory was freed (row H5)
        aid, exporter = entry
        a = self.fabric.allocs.get(aid)
        exp = self.fabric.processes.get(exporter)
        if a is None or exp is None or a.freed:
            raise Fail(unconfirmed.code("H5"))
        cross_host = exp.host != self.proc.host
        if cross_host and self.fabric.rule_on("L8"):
            # Row L8: a legacy handle names OS-local driver state; on another host, even in
            # one NVLink domain (GB200 trays), it resolves to nothing (flashinfer#2006, vLLM#52778).
            raise Fail(E.cudaErrorInvalidResourceHandle)
        if exporter == self.proc.pid:
            raise Fail(E.cudaErrorDeviceUninitialized)      # row L9 (ucx#11603)
        if not cross_host and self.cluster.host(exp.host).process_namespace(exporter) != self.shm_namespace():
            # Row W6: legacy IPC between containers of one host (no shared pid / IPC namespace)
            # is refused: NVIDIA/nccl#360 (the driver checks the peer pid), vllm-project/vllm#55906
            # ("invalid device context" with isolated pid namespaces). Code UNCONFIRMED.
            raise Fail(unconfirmed.code("W6"))
        me = self.device
        if not cross_host and me != a.gpu and not self._can_access(me, a.gpu):
            raise Fail(E.cudaErrorPeerAccessUnsupported)    # row L10 (sglang#4814)
        if not cross_host and me != a.gpu:
            refused = self.cluster.host(me.host).link(me.index, a.gpu.index).ipc_refused
            if refused == "acs":
                # Row P1: ACS redirects peer TLPs although P2P is reported (NCCL p2p.cc
                # "failed to open CUDA IPC handle : 217", ray-project/ray#16979).
                raise Fail(E.cudaErrorPeerAccessUnsupported)
            if refused == "iommu":
                # Row P2: IOMMU translation on; the open answers 101 while
                # cudaDeviceCanAccessPeer says 1 (NVIDIA/TensorRT-LLM#17034).
                raise Fail(E.cudaErrorInvalidDevice)
        if aid in self._ipc_open and self.cluster.host(me.host).driver_major < unconfirmed.IPC_REOPEN_REFCOUNT_SINCE:
            raise Fail(E.cudaErrorAlreadyMapped)             # row H2 (older drivers)
        if aid in self._ipc_open:                            # rows L6/H1: same pointer, refcount
            base = self._ipc_open[aid]
            self._maps[base].refs += 1
            self.ledger.add("ipc_mapping", ("aid", aid), "")
            return base
        if self._peer_maps >= unconfirmed.MAX_PEER_MAPPINGS:
            raise Fail(E.cudaErrorTooManyPeers)              # row L12
        base = self._va(a.size)
        self._add_map(Mapping(base, max(a.size, 1), "ipc", a))
        self._ipc_open[aid] = base
        self._peer_maps += 1
        self.ledger.add("ipc_mapping", ("aid", aid),
                        f"cudaIpcOpenMemHandle of {a.gpu}'s allocation from pid {exporter}")
        return base

    @api(1, False)
    def cuPointerGetAttribute(self, attribute: Any, ptr: int) -> int:
        """The attributes graph-buffer registration asks (reference §1.3): 11 RANGE_START_ADDR
        and 12 RANGE_SIZE of the allocation or mapping holding `ptr` (vLLM sends the base's
        IPC handle plus the offset), 10 IS_LEGACY_CUDA_IPC_CAPABLE (1 only for cudaMalloc
        memory, row L2). A pointer in no allocation is CUDA_ERROR_INVALID_VALUE (cuda.h).
        Other attributes are not modelled: CUDA_ERROR_INVALID_VALUE here (UNCONFIRMED as an
        answer; the real driver knows them)."""
        hit = self._find(_attr_int(ptr))
        a = _attr_int(attribute)
        if hit is None or a not in (10, 11, 12):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        m = hit[0]
        return {10: int(m.kind == "malloc"), 11: m.base, 12: m.size}[a]

    @api(0, True)
    def cudaIpcCloseMemHandle(self, dev_ptr: int) -> None:
        m = self._maps.get(_attr_int(dev_ptr))
        if m is None or m.kind != "ipc":
            raise Fail(E.cudaErrorInvalidValue)
        a: PhysicalAlloc = m.target
        m.refs -= 1                                           # row L14
        self.ledger.remove("ipc_mapping", ("aid", a.aid))
        if m.refs <= 0:
            self._del_map(m)
            self._ipc_open.pop(a.aid, None)
            self._peer_maps -= 1

    # ---- VMM --------------------------------------------------------------------------------
    def _prop_device(self, prop: Any) -> GpuRef:
        try:
            ordinal = prop.location.id
        except AttributeError:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return self._dev(ordinal)

    @api(1, False)
    def cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> int:
        self._prop_device(prop)
        return unconfirmed.GRANULARITY_RECOMMENDED if _attr_int(option) == 1 else unconfirmed.GRANULARITY_MIN

    def _fabric_ready(self, g: GpuRef) -> bool:
        return self.cluster.gpu(g).fabric.state == FabricState.COMPLETED

    @api(1, False)
    def cuMemCreate(self, size: int, prop: Any, flags: int) -> int:
        g = self._prop_device(prop)
        gpu = self.cluster.gpu(g)
        size = _attr_int(size)
        types = _prop_handle_types(prop)
        if size <= 0 or size % unconfirmed.GRANULARITY_MIN or types < 0 or types & ~(FD | FABRIC | 0x6):
            raise Fail(unconfirmed.code("V1"))
        if not gpu.vmm:
            raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
        if types & FD and not gpu.posix_fd:
            raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
        if types & FABRIC:
            if not gpu.fabric_handle:
                raise Fail(unconfirmed.code("V4"))
            if not self.imex_channels() and self.fabric.rule_on("V3"):
                raise Fail(R.CUDA_ERROR_NOT_PERMITTED)      # row V3 (DeepEP#487, IMEX guide)
            if not self._fabric_ready(g):
                raise Fail(unconfirmed.code("X2"))
        if self.bytes_used(g) + size > gpu.memory_bytes:
            raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
        a = self.fabric.new_alloc(g, size, legacy=False, owner=self.proc.pid, handle_types=types)
        if a is None:
            raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)    # the host cannot back it
        h = self._new_handle(("mem", a.aid))
        self.ledger.add("vmm_handle", ("mem", a.aid, h), f"cuMemCreate({size}) on {g}, types {types:#x}")
        return h

    def _new_handle(self, target: tuple[str, int]) -> int:
        h = self._next_handle
        self._next_handle += 1
        self._handles[h] = target
        return h

    def _handle(self, handle: Any) -> tuple[str, int]:
        t = self._handles.get(_attr_int(handle))
        if t is None:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return t

    def _obj(self, target: tuple[str, int]) -> PhysicalAlloc | MulticastObject:
        kind, oid = target
        obj = (self.fabric.allocs if kind == "mem" else self.fabric.multicasts).get(oid)
        if obj is None:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return obj

    @api(1, False)
    def cuMemExportToShareableHandle(self, handle: int, handle_type: Any, flags: int) -> Any:
        target = self._handle(handle)
        obj = self._obj(target)
        t = _attr_int(handle_type)
        if t not in (FD, FABRIC) or not obj.handle_types & t:
            raise Fail(unconfirmed.code("X1"))
        if t == FABRIC:
            return self.fabric.fabric_handle_for(*target)       # 64 bytes, any transport
        fd = self._fds.open(target)
        obj.refs += 1   # an open fd keeps the memory alive until closed (§2.3)
        self.ledger.add("exported_fd", fd, f"POSIX fd {fd} for {target[0]} {target[1]}")
        return fd

    def bytes_used(self, gpu: GpuRef) -> int:
        """Device memory every process holds on `gpu`, after dropping what programs released
        by closing a POSIX fd themselves (noticed lazily, see real_fds)."""
        real_fds.reap_fabric(self.fabric)
        return self.fabric.device_bytes_used(gpu)

    def _unref_target(self, target: tuple[str, int]) -> None:
        kind, oid = target
        obj = (self.fabric.allocs if kind == "mem" else self.fabric.multicasts).get(oid)
        if isinstance(obj, PhysicalAlloc):
            self.fabric.unref_alloc(obj)
        elif obj is not None:
            self.fabric.unref_multicast(obj)

    def close_fd(self, fd: int) -> int:
        """os.close of an exported or received fd: 0, or -1 (EBADF) like the syscall. What
        os.close itself refuses before the syscall it refuses the same way: a non-integer is
        a TypeError, one past a C int an OverflowError."""
        fd = operator.index(fd)
        if not -(1 << 31) <= fd < (1 << 31):
            raise OverflowError("Python int too large to convert to C int")
        target = self._fds.pop(fd, None)
        if target is None:
            return -1
        self.ledger.remove("exported_fd", fd, all_refs=True)
        self._unref_target(target)
        return 0

    def fd_channel(self) -> SimFdChannel:
        return SimFdChannel(self)

    def receive_fd(self, target: tuple[str, int]) -> int:
        """The receiving end of SCM_RIGHTS: a new fd in this process (see sim/fd_channel.py).
        An exited process receives nothing (its socket is gone: fd_channel.pass_fd refuses
        before this), so no reference is taken that nobody would drop."""
        if not self.proc.alive:
            raise RuntimeError(f"pid {self.proc.pid} has exited; it cannot receive an fd")
        fd = self._fds.open(target)
        kind, oid = target
        obj = (self.fabric.allocs if kind == "mem" else self.fabric.multicasts).get(oid)
        if obj is not None:
            obj.refs += 1
        self.ledger.add("exported_fd", fd, f"POSIX fd {fd} received for {target[0]} {target[1]}")
        return fd

    def fd_target(self, fd: int) -> tuple[str, int] | None:
        """What `fd` refers to in this process; None for anything that is no open fd (a
        garbage value included: sendmsg then fails with EBADF)."""
        try:
            return self._fds.get(fd)
        except TypeError:          # unhashable garbage
            return None

    @api(1, False)
    def cuMemImportFromShareableHandle(self, os_handle: Any, handle_type: Any) -> int:
        t = _attr_int(handle_type)
        me = self.device
        if t == FD:
            target = self._fds.for_import(os_handle)
            if target is None:
                raise Fail(unconfirmed.code("X4"))
        elif t == FABRIC:
            key = _handle_bytes(os_handle, "data")
            if key is None:
                raise Fail(R.CUDA_ERROR_INVALID_VALUE)
            target = self.fabric.resolve_fabric_handle(key)
            if target is None:
                raise Fail(R.CUDA_ERROR_INVALID_VALUE)
            if not self.cluster.gpu(me).fabric_handle:
                raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)           # row V6
            if not self.imex_channels() and self.fabric.rule_on("V5"):
                raise Fail(R.CUDA_ERROR_NOT_PERMITTED)           # row V5
            obj = self._obj(target)
            src = obj.gpu if isinstance(obj, PhysicalAlloc) else obj.creator
            src_host = self.cluster.host(src.host)
            if not set(src_host.usable_imex_channels) & set(self.imex_channels()) and self.fabric.rule_on("V5"):
                raise Fail(R.CUDA_ERROR_NOT_PERMITTED)           # same channel needed (§2.3)
            if src != me and not self.cluster.same_domain(src, me):
                self.fabric.flag(f"pid {self.proc.pid}: FABRIC import from {src} outside its "
                                 f"NVLink domain (row V7, UNCONFIRMED code)")
                raise Fail(unconfirmed.code("V7"))
            if not self.cluster.same_imex_domain(self.proc.host, src.host) and self.fabric.rule_on("I3"):
                # Rows I2/I3: a node-local channel lets a process re-import its own handle, but
                # a host in another IMEX domain cannot (meta-pytorch/torchcomms#3517); the code
                # is V5's by analogy (UNCONFIRMED).
                raise Fail(unconfirmed.code("I3"))
        else:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        obj = self._obj(target)
        obj.refs += 1                                            # row V14: needs its own release
        h = self._new_handle(target)
        self.ledger.add("imported_handle", (target[0], target[1], h),
                        f"import of {target[0]} {target[1]} ({'fd' if t == FD else 'fabric'})")
        return h

    @api(1, False)
    def cuMemAddressReserve(self, size: int, alignment: int, addr: int, flags: int) -> int:
        size, align = _attr_int(size), _attr_int(alignment)
        if size <= 0 or size % unconfirmed.HOST_PAGE or align < 0 or (align & (align - 1)):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        base = self._va(size, max(align, unconfirmed.GRANULARITY_MIN))
        self._reserved[base] = size
        bisect.insort(self._rbases, base)
        self.ledger.add("reservation", base, f"cuMemAddressReserve({size})")
        return base

    def _in_reservation(self, ptr: int, size: int) -> bool:
        # Reservations never overlap, so only the last one starting at or below ptr can hold
        # it (a scan per map made peer mapping cubic in the rank count).
        i = bisect.bisect_right(self._rbases, ptr) - 1
        if i < 0:
            return False
        b = self._rbases[i]
        return ptr + size <= b + self._reserved[b]

    def _overlaps_map(self, ptr: int, size: int) -> bool:
        """Whether [ptr, ptr+size) meets a live mapping: mappings never overlap, so their ends
        are sorted like their bases and the last one starting below ptr+size decides."""
        i = bisect.bisect_left(self._bases, ptr + size) - 1
        if i < 0:
            return False
        b = self._bases[i]
        return b + self._maps[b].size > ptr

    @api(0, False)
    def cuMemMap(self, ptr: int, size: int, offset: int, handle: int, flags: int) -> None:
        ptr, size, offset = _attr_int(ptr), _attr_int(size), _attr_int(offset)
        target = self._handle(handle)
        obj = self._obj(target)
        gran = unconfirmed.GRANULARITY_MIN if target[0] == "mem" else unconfirmed.MULTICAST_GRANULARITY_MIN
        if size <= 0 or ptr % gran or size % gran or offset != 0 or size > obj.size:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)               # §2.3: granularity, offset 0
        if not self._in_reservation(ptr, size) or self._overlaps_map(ptr, size):
            raise Fail(unconfirmed.code("V10"))
        if isinstance(obj, MulticastObject):
            # Row M2: mapping a multicast handle blocks until every device has joined.
            wait_until(lambda: len(obj.devices) >= obj.num_devices,
                       f"cuMemMap of multicast object {obj.mid}: {len(obj.devices)} of "
                       f"{obj.num_devices} devices added (row M2)")
        obj.maps += 1
        kind = "vmm" if target[0] == "mem" else "mc"
        self._add_map(Mapping(ptr, size, kind, obj, access=False, handle=_attr_int(handle)))
        self.ledger.add("vmm_mapping", ptr, f"cuMemMap {kind} {target[1]} at {ptr:#x}+{size}")

    @api(0, False)
    def cuMemSetAccess(self, ptr: int, size: int, desc: Sequence[Any], count: int) -> None:
        ptr, size = _attr_int(ptr), _attr_int(size)
        cur, hits = ptr, []
        while cur < ptr + size:       # §2.3: must cover a fully mapped range
            m = self._maps.get(cur)
            if m is None or m.kind not in ("vmm", "mc"):
                raise Fail(R.CUDA_ERROR_INVALID_VALUE)
            hits.append(m)
            cur += m.size
        if cur != ptr + size or size <= 0:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        try:
            devs = [self._dev(d.location.id) for d in list(desc)[:max(_attr_int(count), 0)]]
        except (AttributeError, TypeError):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        for m in hits:
            m.access = self.device in devs or bool(devs)

    @api(0, False)
    def cuMemUnmap(self, ptr: int, size: int) -> None:
        m = self._maps.get(_attr_int(ptr))
        if m is None or m.kind not in ("vmm", "mc"):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if _attr_int(size) != m.size:
            raise Fail(unconfirmed.code("V12"))                        # row V12: whole range only
        self._del_map(m)
        self.ledger.remove("vmm_mapping", m.base, all_refs=True)
        obj = m.target
        obj.maps -= 1
        if obj.refs <= 0 and obj.maps <= 0:                      # row V13
            if isinstance(obj, PhysicalAlloc):
                self.fabric.free_alloc(obj)
            else:
                self.fabric.unref_multicast(obj)

    @api(0, False)
    def cuMemRelease(self, handle: int) -> None:
        h = _attr_int(handle)
        target = self._handle(h)
        kind, oid = target
        obj = (self.fabric.allocs if kind == "mem" else self.fabric.multicasts).get(oid)
        del self._handles[h]
        for k in ("vmm_handle", "imported_handle", "multicast"):
            self.ledger.remove(k, (kind, oid, h), all_refs=True)
        if obj is None:
            return None
        if isinstance(obj, PhysicalAlloc):
            self.fabric.unref_alloc(obj)                          # rows V13, V14
        else:
            self.fabric.unref_multicast(obj)

    @api(0, False)
    def cuMemAddressFree(self, ptr: int, size: int) -> None:
        ptr, size = _attr_int(ptr), _attr_int(size)
        if self._reserved.get(ptr) != size:
            raise Fail(unconfirmed.code("V15"))
        i = bisect.bisect_left(self._bases, ptr)
        if i < len(self._bases) and self._bases[i] < ptr + size:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)   # still mapped inside: unmap first
        del self._reserved[ptr]
        self._rbases.pop(bisect.bisect_left(self._rbases, ptr))
        self.ledger.remove("reservation", ptr, all_refs=True)

    # ---- multicast -------------------------------------------------------------------------
    @api(1, False)
    def cuMulticastGetGranularity(self, prop: Any, option: Any) -> int:
        return unconfirmed.MULTICAST_GRANULARITY_RECOMMENDED if _attr_int(option) == 1 \
            else unconfirmed.MULTICAST_GRANULARITY_MIN

    @api(1, False)
    def cuMulticastCreate(self, prop: Any) -> int:
        g = self.device
        try:
            n, size, types = int(prop.numDevices), int(prop.size), int(prop.handleTypes)
        except (AttributeError, TypeError, ValueError, OverflowError):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)   # a duck-typed prop with inf or garbage
        if not self.cluster.gpu(g).multicast or self.cluster.domain_of(g) is None:
            raise Fail(unconfirmed.code("M1"))                          # rows M1, MC1
        if not self.cluster.host(self.proc.host).container.nvidia_caps:
            # Row MC3: a container without /dev/nvidia-caps: NCCL nvls.cc:251 "Cuda failure 1
            # 'invalid argument'" at cuMulticastCreate (pie-project/pie#500, NVIDIA/nccl#1672).
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if n < 1 or size <= 0 or size % unconfirmed.MULTICAST_GRANULARITY_MIN:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if n > self.cluster.num_gpus:
            # More devices than the whole cluster has can never join (UNCONFIRMED: the real
            # driver's code for an impossible numDevices; INVALID_VALUE like the other props).
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if types & FABRIC and not self.imex_channels():
            raise Fail(unconfirmed.code("MC4"))                         # row MC4 (UNCONFIRMED)
        m = self.fabric.new_multicast(g, n, size, types)
        h = self._new_handle(("mc", m.mid))
        self.ledger.add("multicast", ("mc", m.mid, h), f"cuMulticastCreate({n} devices, {size} B)")
        return h

    def _mc(self, handle: Any) -> MulticastObject:
        target = self._handle(handle)
        if target[0] != "mc":
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return self._obj(target)

    @api(0, False)
    def cuMulticastAddDevice(self, mc_handle: int, dev: int) -> None:
        mc = self._mc(mc_handle)
        g = self._dev(dev)
        if not self.cluster.host(self.proc.host).container.nvidia_caps:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)   # row MC3: no /dev/nvidia-caps here either
        if not self.cluster.gpu(g).multicast:
            raise Fail(unconfirmed.code("M1"))
        if g != mc.creator and not self.cluster.same_domain(g, mc.creator):
            raise Fail(unconfirmed.code("X3"))
        if mc.bindings:
            # Row MC2: every device joins before any bind; a late AddDevice answers 401 "the
            # operation cannot be performed in the present state" (NVIDIA/nccl#1788).
            raise Fail(R.CUDA_ERROR_ILLEGAL_STATE)
        if g in mc.devices or len(mc.devices) >= mc.num_devices:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        mc.devices.append(g)

    @api(0, False)
    def cuMulticastBindMem(self, mc_handle: int, mc_offset: int, mem_handle: int,
                           mem_offset: int, size: int, flags: int) -> None:
        mc = self._mc(mc_handle)
        target = self._handle(mem_handle)
        if target[0] != "mem":
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        a: PhysicalAlloc = self._obj(target)
        mc_off, mem_off, size = _attr_int(mc_offset), _attr_int(mem_offset), _attr_int(size)
        gran = unconfirmed.MULTICAST_GRANULARITY_MIN
        if min(mc_off, mem_off) < 0 or size <= 0 or mc_off % gran or mem_off % gran or size % gran:
            raise Fail(unconfirmed.code("M5"))
        if mc_off + size > mc.size or mem_off + size > a.size:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if a.gpu not in self.proc.gpus:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)   # memHandle must be from a local team device
        # Row M2: bind blocks until every device has joined.
        wait_until(lambda: len(mc.devices) >= mc.num_devices,
                   f"cuMulticastBindMem on multicast object {mc.mid}: {len(mc.devices)} of "
                   f"{mc.num_devices} devices added (row M2)")
        if a.gpu not in mc.devices:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if not self._fabric_ready(a.gpu) and self.cluster.gpu(a.gpu).fabric.state != FabricState.NOT_SUPPORTED:
            raise Fail(R.CUDA_ERROR_SYSTEM_NOT_READY)              # row M3
        if a.gpu in mc.bindings:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        mc.bindings[a.gpu] = (a, mem_off, mc_off, size)
        a.maps += 1   # the binding keeps the physical memory alive like a mapping
        self.ledger.add("multicast_binding", (mc.mid, str(a.gpu)), f"bind {a.gpu} to multicast {mc.mid}")

    @api(0, False)
    def cuMulticastUnbind(self, mc_handle: int, dev: int, mc_offset: int, size: int) -> None:
        mc = self._mc(mc_handle)
        g = self._dev(dev)
        b = mc.bindings.get(g)
        if b is None:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if (b[2], b[3]) != (_attr_int(mc_offset), _attr_int(size)):
            self.fabric.flag(f"pid {self.proc.pid}: cuMulticastUnbind with offset/size other than "
                             f"bound (undefined, row M6)")
            raise Fail(unconfirmed.code("M6"))
        a = b[0]
        del mc.bindings[g]
        a.maps -= 1
        self.ledger.remove("multicast_binding", (mc.mid, str(g)), all_refs=True)
        if a.refs <= 0 and a.maps <= 0:
            self.fabric.free_alloc(a)

    # ---- NVML --------------------------------------------------------------------------------
    def _nvml_gpu(self, index: int):
        h = self.cluster.host(self.proc.host)
        i = _attr_int(index) if isinstance(index, int) or hasattr(index, "__index__") else -1
        if not 0 <= i < len(h.gpus):
            return None
        return h.gpus[i]

    def nvmlDeviceGetGpuFabricInfo(self, index: int) -> tuple:
        g = self._nvml_gpu(index)
        if g is None:
            return (2, None)   # NVML_ERROR_INVALID_ARGUMENT
        f = g.fabric
        return (0, GpuFabricInfo(f.cluster_uuid, f.status, f.clique_id, int(f.state)))

    def nvmlDeviceGetP2PStatus(self, index1: int, index2: int) -> tuple:
        """NVML_P2P_CAPS_INDEX_NVLINK status, what vLLM's `is_fully_connected` reads (§6.1.1)."""
        h = self.cluster.host(self.proc.host)
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

    def nvmlDeviceGetNvLinkState(self, index: int) -> tuple:
        """Whether every P2P-capable NVLink of the GPU is active (FlashInfer / TRT-LLM, §4.2)."""
        g = self._nvml_gpu(index)
        if g is None:
            return (2, None)
        return (0, bool(g.nvlinks_up))

    # ---- kernels ------------------------------------------------------------------------------
    @api(0, True)
    def launch_kernel(self, kernel: Callable[..., None], *args: Any) -> None:
        """Run a reference kernel (commsim/kernels/) on the current device. A fault inside it
        (unmapped, no access, freed memory) is cudaErrorIllegalAddress (700)."""
        kernel(SimKernelContext(self), *args)
