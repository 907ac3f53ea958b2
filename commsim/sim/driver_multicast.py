"""SimDriver's multicast (NVLS) object calls: cuMulticastGetGranularity, Create, AddDevice,
BindMem, Unbind, with the rules they follow (each row cited beside its code; the rows' cases and
sources are tests/conformance/test_rules.py)."""

from __future__ import annotations

from typing import Any

from commsim.driver import FABRIC
from commsim.runtime.scheduler import wait_until
from commsim.topology.model import MULTICAST_SINCE_BRANCH, FabricState
from commsim.sim import unconfirmed
from commsim.sim.driver_calls import R, Fail, api
from commsim.sim.fabric import MulticastObject, PhysicalAlloc





class MulticastCalls:
    """Mixin of SimDriver (driver.py): these calls use its address space, ledger and fabric."""

    # ---- multicast -------------------------------------------------------------------------
    @api(1, False)
    def cuMulticastGetGranularity(self, prop: Any, option: Any) -> int:
        return unconfirmed.MULTICAST_GRANULARITY_RECOMMENDED if option == 1 \
            else unconfirmed.MULTICAST_GRANULARITY_MIN

    @api(1, False)
    def cuMulticastCreate(self, prop: Any) -> int:
        g = self.device
        try:
            n, size, types = int(prop.numDevices), int(prop.size), int(prop.handleTypes)
        except (AttributeError, TypeError, ValueError, OverflowError):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)   # a duck-typed prop with inf or garbage
        if not self.cluster.gpu(g).multicast or self.cluster.domain_of(g) is None \
                or self.cluster.driver_major(g.host) < MULTICAST_SINCE_BRANCH:
            raise Fail(unconfirmed.code("M1"))                          # rows M1, MC1, M9
        if not self._host.container.nvidia_caps:
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
        self.ledger.add("multicast", ("mc", m.mid, h), "cuMulticastCreate({} devices, {} B)", n, size)
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
        if not self._host.container.nvidia_caps:
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
        mc_off, mem_off = mc_offset, mem_offset
        gran = unconfirmed.MULTICAST_GRANULARITY_MIN
        if min(mc_off, mem_off) < 0 or size <= 0 or mc_off % gran or mem_off % gran or size % gran:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)   # row M5 (NCCL src/transport/nvls.cc)
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
        self.ledger.add("multicast_binding", (mc.mid, str(a.gpu)), "bind {} to multicast {}", a.gpu, mc.mid)

    @api(0, False)
    def cuMulticastUnbind(self, mc_handle: int, dev: int, mc_offset: int, size: int) -> None:
        mc = self._mc(mc_handle)
        g = self._dev(dev)
        b = mc.bindings.get(g)
        if b is None:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if (b[2], b[3]) != (mc_offset, size):
            self.fabric.flag(f"pid {self.proc.pid}: cuMulticastUnbind with offset/size other than "
                             f"bound (undefined, row M6)")
            raise Fail(unconfirmed.code("M6"))
        a = b[0]
        del mc.bindings[g]
        a.maps -= 1
        self.ledger.remove("multicast_binding", (mc.mid, str(g)), all_refs=True)
        if a.refs <= 0 and a.maps <= 0:
            self.fabric.free_alloc(a)
