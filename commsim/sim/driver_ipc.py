"""SimDriver's legacy CUDA IPC calls (cudaIpcGetMemHandle / OpenMemHandle / CloseMemHandle) and
cuPointerGetAttribute, with the rules they follow (each row cited beside its code; the rows'
cases and sources are tests/conformance/test_rules.py)."""

from __future__ import annotations

from typing import Any

from commsim.driver import LAZY_ENABLE_PEER_ACCESS
from commsim.sim import unconfirmed
from commsim.sim.driver_calls import E, R, Fail, Mapping, _attr_int, _handle_bytes, api
from commsim.sim.fabric import PhysicalAlloc



class LegacyIpcCalls:
    """Mixin of SimDriver (driver.py): these calls use its address space, ledger and fabric."""

    # ---- legacy IPC -----------------------------------------------------------------------
    @api(1, True)
    def cudaIpcGetMemHandle(self, dev_ptr: int) -> bytes:
        hit = self._find(dev_ptr)
        if hit is None:
            raise Fail(E.cudaErrorInvalidValue)
        m, off = hit
        if m.kind != "malloc":
            raise Fail(E.cudaErrorInvalidValue)        # rows L2, H4: VMM memory has no legacy handle
        # Rows L3/H3: a pointer inside the allocation gives the handle of its base (identical
        # bytes, openucx/ucx#11724); the importer adds the offset itself (RANGE_START_ADDR).
        self._ipc_exported.add(m.target.aid)
        return self.fabric.ipc_handle_for(m.target, self.proc.pid)   # rows L1, L4

    def _ipc_device_rules(self, gpu: Any, exporter: int) -> None:
        """The rules of a legacy IPC open that the exporting GPU and process decide."""
        cross_host = gpu.host != self.proc.host
        if cross_host and self.fabric.rule_on("L8"):
            # Row L8: a legacy handle names OS-local driver state; on another host, even in
            # one NVLink domain (GB200 trays), it resolves to nothing (flashinfer#2006, vLLM#52778).
            raise Fail(E.cudaErrorInvalidResourceHandle, "L8", gpu)
        if cross_host:
            return
        if self.cluster.host(gpu.host).process_namespace(exporter) != self.shm_namespace():
            # Row W6: legacy IPC between containers of one host (no shared pid / IPC namespace)
            # is refused: NVIDIA/nccl#360 (the driver checks the peer pid), vllm-project/vllm#55906
            # ("invalid device context" with isolated pid namespaces). Code UNCONFIRMED.
            raise Fail(unconfirmed.code("W6"), "W6", gpu)
        me = self.device
        if me != gpu and not self._can_access(me, gpu):
            raise Fail(E.cudaErrorPeerAccessUnsupported, "L10", gpu)    # row L10 (sglang#4814)
        if me != gpu:
            refused = self.cluster.host(me.host).link(me.index, gpu.index).ipc_refused
            if refused == "acs":
                # Row P1: ACS redirects peer TLPs although P2P is reported (NCCL p2p.cc
                # "failed to open CUDA IPC handle : 217", ray-project/ray#16979).
                raise Fail(E.cudaErrorPeerAccessUnsupported, "P1", gpu)
            if refused == "iommu":
                # Row P2: IOMMU translation on; the open answers 101 while
                # cudaDeviceCanAccessPeer says 1 (NVIDIA/TensorRT-LLM#17034).
                raise Fail(E.cudaErrorInvalidDevice, "P2", gpu)

    @api(1, True)
    def cudaIpcOpenMemHandle(self, handle: Any, flags: int) -> int:
        if flags != int(LAZY_ENABLE_PEER_ACCESS):
            raise Fail(unconfirmed.code("L13"))
        key = _handle_bytes(handle, "reserved")
        entry = self.fabric.resolve_ipc_handle(key) if key is not None else None
        if entry is None:
            gone = self.fabric.ipc_handle_origin(key) if key is not None else None
            if gone is not None and unconfirmed.IPC_DEVICE_RULES_BEFORE_GONE:
                # The exporter freed the memory or exited: row H6 (unconfirmed.py).
                self._ipc_device_rules(gone[0], gone[1])
            raise Fail(unconfirmed.code("H5"), "H5", gone[0] if gone else None)
        aid, exporter = entry
        a = self.fabric.allocs.get(aid)
        exp = self.fabric.processes.get(exporter)
        if a is None or exp is None or a.freed:
            raise Fail(unconfirmed.code("H5"), "H5", a.gpu if a is not None else None)
        if exporter == self.proc.pid:
            raise Fail(E.cudaErrorDeviceUninitialized, "L9", a.gpu)      # row L9 (ucx#11603)
        self._ipc_device_rules(a.gpu, exporter)
        me = self.device
        if aid in self._ipc_open and self.cluster.driver_major(me.host) < unconfirmed.IPC_REOPEN_REFCOUNT_SINCE:
            raise Fail(E.cudaErrorAlreadyMapped)             # row H2 (older drivers)
        if aid in self._ipc_open:                            # rows L6/H1: same pointer, refcount
            base = self._ipc_open[aid]
            self._maps[base].refs += 1
            self.ledger.add("ipc_mapping", ("aid", aid), "")
            return base
        if self._peer_maps >= unconfirmed.MAX_PEER_MAPPINGS:
            raise Fail(E.cudaErrorTooManyPeers)              # row L12
        base = self._va(a.size)
        self._add_map(Mapping(base, max(a.size, 1), "ipc", a, device=me))
        self._ipc_open[aid] = base
        self._peer_maps += 1
        self.ledger.add("ipc_mapping", ("aid", aid),
                        "cudaIpcOpenMemHandle of {}'s allocation from pid {}", a.gpu, exporter)
        return base

    @api(1, False)
    def cuPointerGetAttribute(self, attribute: Any, ptr: int) -> int:
        """The attributes graph-buffer registration asks: 11 RANGE_START_ADDR
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
        m = self._maps.get(dev_ptr)
        if m is None or m.kind != "ipc":
            raise Fail(E.cudaErrorInvalidValue)
        self._close_ipc(m, m.refs - 1)                        # row L14

    def _close_ipc(self, m: Mapping, refs_left: int) -> None:
        """Drop the references of an "ipc" mapping down to `refs_left`; unmap it at 0."""
        a: PhysicalAlloc = m.target
        for _ in range(m.refs - refs_left):
            self.ledger.remove("ipc_mapping", ("aid", a.aid))
        m.refs = refs_left
        if m.refs <= 0:
            self._del_map(m)
            self._ipc_open.pop(a.aid, None)
            self._peer_maps -= 1
