"""SimDriver's virtual memory management calls (cuMemCreate ... cuMemAddressFree), the shareable
handles they export and import (POSIX fds as real fds, FABRIC blobs), with the rules they follow
(each row cited beside its code; the rows' cases and sources are
tests/conformance/test_rules.py)."""

from __future__ import annotations

import bisect
import operator
from typing import Any, Sequence

from commsim.driver import FABRIC, FD
from commsim.runtime.scheduler import wait_until
from commsim.topology.model import FabricState, GpuRef
from commsim.sim import real_fds, unconfirmed
from commsim.sim.driver_calls import R, Fail, Mapping, _attr_int, _handle_bytes, _prop_handle_types, api
from commsim.sim.fabric import MulticastObject, PhysicalAlloc
from commsim.sim.fd_channel import SimFdChannel



class VmmCalls:
    """Mixin of SimDriver (driver.py): these calls use its address space, ledger and fabric."""

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
        return unconfirmed.GRANULARITY_RECOMMENDED if option == 1 else unconfirmed.GRANULARITY_MIN

    def _fabric_ready(self, g: GpuRef) -> bool:
        return self.cluster.gpu(g).fabric.state == FabricState.COMPLETED

    @api(1, False)
    def cuMemCreate(self, size: int, prop: Any, flags: int) -> int:
        g = self._prop_device(prop)
        gpu = self.cluster.gpu(g)
        types = _prop_handle_types(prop)
        if size <= 0 or size % unconfirmed.GRANULARITY_MIN or types < 0 or types & ~(FD | FABRIC | 0x6):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)     # row V1 (torch_memory_saver#82)
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
        self.ledger.add("vmm_handle", ("mem", a.aid, h), "cuMemCreate({}) on {}, types {:#x}", size, g, types)
        return h

    def _new_handle(self, target: tuple[str, int]) -> int:
        h = self._next_handle
        self._next_handle += 1
        self._handles[h] = target
        return h

    def _handle(self, handle: Any) -> tuple[str, int]:
        t = self._handles.get(handle)
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
        obj.refs += 1   # an open fd keeps the memory alive until closed (cuda.h)
        self.ledger.add("exported_fd", fd, "POSIX fd {} for {} {}", fd, target[0], target[1])
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
        self.ledger.add("exported_fd", fd, "POSIX fd {} received for {} {}", fd, target[0], target[1])
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
                raise Fail(R.CUDA_ERROR_NOT_PERMITTED)           # same channel needed (cuda.h)
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
                        "import of {} {} ({})", target[0], target[1], "fd" if t == FD else "fabric")
        return h

    @api(1, False)
    def cuMemAddressReserve(self, size: int, alignment: int, addr: int, flags: int) -> int:
        align = alignment
        if size <= 0 or size % unconfirmed.HOST_PAGE or align < 0 or (align & (align - 1)):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        base = self._va(size, max(align, unconfirmed.GRANULARITY_MIN))
        self._reserved[base] = size
        bisect.insort(self._rbases, base)
        self.ledger.add("reservation", base, "cuMemAddressReserve({})", size)
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
        target = self._handle(handle)
        obj = self._obj(target)
        gran = unconfirmed.GRANULARITY_MIN if target[0] == "mem" else unconfirmed.MULTICAST_GRANULARITY_MIN
        if size <= 0 or ptr % gran or size % gran or offset != 0 or size > obj.size:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)               # cuda.h: granularity, offset 0
        if not self._in_reservation(ptr, size) or self._overlaps_map(ptr, size):
            raise Fail(unconfirmed.code("V10"))
        if isinstance(obj, MulticastObject):
            # Row M2: mapping a multicast handle blocks until every device has joined.
            wait_until(lambda: len(obj.devices) >= obj.num_devices,
                       f"cuMemMap of multicast object {obj.mid}: {len(obj.devices)} of "
                       f"{obj.num_devices} devices added (row M2)")
        obj.maps += 1
        kind = "vmm" if target[0] == "mem" else "mc"
        self._add_map(Mapping(ptr, size, kind, obj, access=False, handle=handle))
        self.ledger.add("vmm_mapping", ptr, "cuMemMap {} {} at {:#x}+{}", kind, target[1], ptr, size)

    @api(0, False)
    def cuMemSetAccess(self, ptr: int, size: int, desc: Sequence[Any], count: int) -> None:
        cur, hits = ptr, []
        while cur < ptr + size:       # cuda.h: must cover a fully mapped range
            m = self._maps.get(cur)
            if m is None or m.kind not in ("vmm", "mc"):
                raise Fail(R.CUDA_ERROR_INVALID_VALUE)
            hits.append(m)
            cur += m.size
        if cur != ptr + size or size <= 0:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        try:
            devs = [self._dev(d.location.id) for d in list(desc)[:max(count, 0)]]
        except (AttributeError, TypeError):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        for m in hits:
            # Row S3: a device of the same host with no hardware path to the physical memory
            # (a PCIe link without P2P; an NVLink path exists whatever P2P is reported) gets
            # no access: CUDA_ERROR_INVALID_DEVICE ("invalid device ordinal" from PyTorch's
            # symm_mem.rendezvous on two PCIe RTX 2080 Ti, pytorch/pytorch#174030).
            owner = m.target.gpu if isinstance(m.target, PhysicalAlloc) else None
            if owner is not None and any(self._no_peer_path(d, owner) for d in devs):
                raise Fail(R.CUDA_ERROR_INVALID_DEVICE)
        for m in hits:
            m.access = self.device in devs or bool(devs)

    def _no_peer_path(self, dev: GpuRef, owner: GpuRef) -> bool:
        """Row S3: two GPUs of one host joined only by PCIe that does not carry P2P."""
        if dev.host != owner.host or dev.index == owner.index:
            return False
        link = self.cluster.host(dev.host).link(dev.index, owner.index)
        return not link.is_nvlink and not link.p2p

    @api(0, False)
    def cuMemUnmap(self, ptr: int, size: int) -> None:
        m = self._maps.get(ptr)
        if m is None or m.kind not in ("vmm", "mc"):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if size != m.size:
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
        h = handle
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
        if self._reserved.get(ptr) != size:
            raise Fail(unconfirmed.code("V15"))
        i = bisect.bisect_left(self._bases, ptr)
        if i < len(self._bases) and self._bases[i] < ptr + size:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)   # still mapped inside: unmap first
        del self._reserved[ptr]
        self._rbases.pop(bisect.bisect_left(self._rbases, ptr))
        self.ledger.remove("reservation", ptr, all_refs=True)
