"""The semantics as a table: one case per rule the simulated driver follows (legacy IPC L,
VMM V, multicast M, fabric info F of docs/driver-rules.md, and the rows of docs/fidelity-rules.md).

Each Case names its row and the public citation behind it (CUDA 13.0 headers, nvml.h, NCCL
and serving-stack sources, issue threads), the topology and the placement
of its processes (one simulated process per placement entry, built by conftest.make_rig, the
only factory), and a body written against the Driver protocol (commsim/driver.py) plus
`check`. The body returns the result tuple of the call the rule is about; the runner checks
its code against `expect`, then checks the full teardown: every process's ledger is empty and
no physical memory or multicast object is left (nothing leaks: the ledger is zero after teardown).

Rows whose exact code the docs mark UNCONFIRMED expect `unconfirmed.UNCONFIRMED[row]` and
carry "UNCONFIRMED: chosen" in their test id: the simulator's table is the one place to
correct them when a GPU run (COMMSIM_DEVICE=cuda) sees another code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest

from commsim.driver import (CudaError, FABRIC_HANDLE_SIZE, IPC_HANDLE_SIZE, LAZY_ENABLE_PEER_ACCESS,
                            NVML_P2P_STATUS_NOT_SUPPORTED, NVML_P2P_STATUS_OK, DevAttr, HandleType,
                            access_desc, alloc_prop, check, cudaError_t, CUresult, multicast_prop)
from commsim.runtime.diagnosis import HangDetected
from commsim.runtime.scheduler import wait_until
from commsim.sim import unconfirmed
from commsim.driver import FdTransportError
from commsim.topology import modify
from commsim.topology.model import ContainerCaps, FabricState, GpuRef, ImexDomain, NvlinkDomain
from commsim.topology.presets import build

E = cudaError_t
R = CUresult
FD = HandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
FABRIC = HandleType.CU_MEM_HANDLE_TYPE_FABRIC
LAZY = int(LAZY_ENABLE_PEER_ACCESS)
MIB = 1 << 20
DTOD = 3   # cudaMemcpyDeviceToDevice


@dataclass(frozen=True)
class U:
    """Expect the simulator's chosen code for an UNCONFIRMED row (read at run time)."""

    row: str

    def code(self) -> Any:
        return unconfirmed.code(self.row)


@dataclass(frozen=True)
class Case:
    row: str                                   # the rule's row id (or a name for a non-row fact)
    title: str
    source: str                                # citation, as the row's docs table gives it
    topology: str | Callable[[], Any]          # preset spec, or a function building a Cluster
    placement: tuple[tuple[int, int], ...]     # (host index, gpu index) per process
    body: Callable[[Any], Any]
    expect: Any = None                         # code of the tuple the body returns
    residue: bool = False                      # the body ends with a deliberate leak
    skip: str | None = None
    sim_only: bool = False                     # needs the simulator itself (its limits, exit)
    xfail: str | None = None                   # a known divergence of the simulator

    @property
    def unconfirmed(self) -> bool:
        return isinstance(self.expect, U)

    @property
    def id(self) -> str:
        label = " UNCONFIRMED: chosen" if self.unconfirmed else ""
        return f"{self.row}{label} - {self.title}"


CASES: list[Case] = []


def case(row: str, title: str, source: str, topology, placement, expect=None, **kw):
    def deco(fn):
        CASES.append(Case(row, title, source, topology, tuple(placement), fn, expect, **kw))
        return fn
    return deco


# ---- helpers (Driver protocol only) -------------------------------------------------------

def gran(d, dev: int = 0, types: int = 0) -> int:
    return check("cuMemGetAllocationGranularity",
                 d.cuMemGetAllocationGranularity(alloc_prop(dev, int(types)), 0))


def create(d, size: int, types: int = 0, dev: int | None = None) -> int:
    dev = check("cudaGetDevice", d.cudaGetDevice()) if dev is None else dev
    return check("cuMemCreate", d.cuMemCreate(size, alloc_prop(dev, int(types)), 0))


def map_rw(d, handle: int, size: int, access: bool = True) -> int:
    """Reserve, map `handle` and (unless told not to) grant this device read/write."""
    ptr = check("cuMemAddressReserve", d.cuMemAddressReserve(size, 0, 0, 0))
    check("cuMemMap", d.cuMemMap(ptr, size, 0, handle, 0))
    if access:
        dev = check("cudaGetDevice", d.cudaGetDevice())
        check("cuMemSetAccess", d.cuMemSetAccess(ptr, size, [access_desc(dev)], 1))
    return ptr


def unmap_free(d, ptr: int, size: int) -> None:
    check("cuMemUnmap", d.cuMemUnmap(ptr, size))
    check("cuMemAddressFree", d.cuMemAddressFree(ptr, size))


def pattern(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def code_of(res) -> int:
    return int(res[0])


# ======================== docs/driver-rules.md §1 Legacy IPC (L) ==========================

@case("L1", "cudaIpcGetMemHandle on a cudaMalloc base gives a 64-byte handle", "cuda_runtime_api.h (CUDA 13.0)",
      "hgx-h100-8", [(0, 0)])
def _(rig):
    d = rig[0]
    p = check("cudaMalloc", d.cudaMalloc(MIB))
    res = d.cudaIpcGetMemHandle(p)
    h = check("cudaIpcGetMemHandle", res)
    assert isinstance(h, bytes) and len(h) == IPC_HANDLE_SIZE
    assert check("cudaIpcGetMemHandle", d.cudaIpcGetMemHandle(p)) == h   # cheap, repeatable
    assert rig.held(0) == {"allocation": 1}
    check("cudaFree", d.cudaFree(p))
    return res


@case("L2", "cudaIpcGetMemHandle on VMM (cuMemCreate + cuMemMap) memory is rejected",
      "cudaIpcGetMemHandle docs; vLLM#42609, vLLM#45611", "hgx-h100-8", [(0, 0)], expect=E.cudaErrorInvalidValue)
def _(rig):
    d = rig[0]
    g = gran(d)
    h = create(d, g)
    ptr = map_rw(d, h, g)
    res = d.cudaIpcGetMemHandle(ptr)
    assert rig.held(0) == {"vmm_handle": 1, "reservation": 1, "vmm_mapping": 1}
    unmap_free(d, ptr, g)
    check("cuMemRelease", d.cuMemRelease(h))
    return res


@case("L3/H3", "cudaIpcGetMemHandle inside a cudaMalloc block gives the base allocation's handle",
      "openucx/ucx#11724 (base and base+offset give identical handles); rows L3, H3",
      "hgx-h100-8", [(0, 0), (0, 1)], expect=E.cudaSuccess)
def _(rig):
    exp, imp = rig[0], rig[1]
    p = check("cudaMalloc", exp.cudaMalloc(MIB))
    check("write", rig.write(0, p, pattern(MIB, 11)))
    res = exp.cudaIpcGetMemHandle(p + 256 * 1024)
    assert check("cudaIpcGetMemHandle", res) == check("base", exp.cudaIpcGetMemHandle(p))
    # The importer maps the base; the sub-allocation is at the offset it adds itself.
    q = check("cudaIpcOpenMemHandle", imp.cudaIpcOpenMemHandle(res[1], LAZY))
    assert check("read", rig.read(1, q + 256 * 1024, 64)) == pattern(MIB, 11)[256 * 1024:256 * 1024 + 64]
    check("cudaIpcCloseMemHandle", imp.cudaIpcCloseMemHandle(q))
    check("cudaFree", exp.cudaFree(p))
    return res


@case("L4", "free + re-cudaMalloc gives a new, different handle", "cuda_runtime_api.h (CUDA 13.0)",
      "hgx-h100-8", [(0, 0)])
def _(rig):
    d = rig[0]
    p1 = check("cudaMalloc", d.cudaMalloc(MIB))
    h1 = check("cudaIpcGetMemHandle", d.cudaIpcGetMemHandle(p1))
    check("cudaFree", d.cudaFree(p1))
    p2 = check("cudaMalloc", d.cudaMalloc(MIB))
    res = d.cudaIpcGetMemHandle(p2)
    h2 = check("cudaIpcGetMemHandle", res)
    assert h2 != h1
    check("cudaFree", d.cudaFree(p2))
    return res


@case("L4/freed", "opening the handle of a freed allocation: invalid resource handle",
      "cuda_runtime_api.h (documented return cudaErrorInvalidResourceHandle); row L4", "gb200-nvl72:1",
      [(0, 0), (0, 1)], expect=E.cudaErrorInvalidResourceHandle)
def _(rig):
    exp, imp = rig[0], rig[1]
    p = check("cudaMalloc", exp.cudaMalloc(MIB))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    check("cudaFree", exp.cudaFree(p))
    res = imp.cudaIpcOpenMemHandle(h, LAZY)
    assert rig.held(1) == {}
    return res


@case("L5", "open on the same host, other process, P2P: ok and the bytes are shared",
      "cuda_runtime_api.h (CUDA 13.0)", "gb200-nvl72:1", [(0, 0), (0, 1)])
def _(rig):
    exp, imp = rig[0], rig[1]
    n = 64 * 1024
    p = check("cudaMalloc", exp.cudaMalloc(n))
    check("write", rig.write(0, p, pattern(n, 1)))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    res = imp.cudaIpcOpenMemHandle(h, LAZY)
    q = check("cudaIpcOpenMemHandle", res)
    assert check("read", rig.read(1, q, n)) == pattern(n, 1)
    check("write", rig.write(1, q, pattern(n, 2)))          # the importer writes back
    assert check("read", rig.read(0, p, n)) == pattern(n, 2)
    assert rig.held(1) == {"ipc_mapping": 1}
    check("cudaIpcCloseMemHandle", imp.cudaIpcCloseMemHandle(q))
    check("cudaFree", exp.cudaFree(p))
    return res


@case("L6", "double open: same pointer, refcounted close (2nd close needed, 3rd fails)",
      "cuda_runtime_api.h (CUDA 13.0), row L14", "gb200-nvl72:1", [(0, 0), (0, 1)])
def _(rig):
    exp, imp = rig[0], rig[1]
    p = check("cudaMalloc", exp.cudaMalloc(4096))
    check("write", rig.write(0, p, pattern(4096, 3)))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    q1 = check("cudaIpcOpenMemHandle", imp.cudaIpcOpenMemHandle(h, LAZY))
    q2 = check("cudaIpcOpenMemHandle", imp.cudaIpcOpenMemHandle(h, LAZY))
    assert q1 == q2
    assert rig.held(1) == {"ipc_mapping": 2}
    check("cudaIpcCloseMemHandle", imp.cudaIpcCloseMemHandle(q1))
    assert rig.held(1) == {"ipc_mapping": 1}
    assert check("read", rig.read(1, q1, 4096)) == pattern(4096, 3)   # still mapped
    check("cudaIpcCloseMemHandle", imp.cudaIpcCloseMemHandle(q1))
    assert rig.held(1) == {}
    third = imp.cudaIpcCloseMemHandle(q1)
    # Documented returns of cudaIpcCloseMemHandle (cuda_runtime_api.h): MapBufferObjectFailed, NotSupported,
    # InvalidValue; the simulator answers InvalidValue for a pointer that is no longer open.
    assert code_of(third) in (int(E.cudaErrorInvalidValue), int(E.cudaErrorMapBufferObjectFailed))
    assert code_of(rig.kernel_read(1, q1, 16)) == int(E.cudaErrorIllegalAddress)   # unmapped
    check("cudaFree", exp.cudaFree(p))
    return third


@case("L7", "second context in one importer process opens the same exporter's handle", "cuda_runtime_api.h",
      "gb200-nvl72:1", [(0, 0), (0, 1)], expect=U("L7"),
      skip="the Driver protocol has no call that creates a second context on one device "
           "(cuCtxCreate), so row L7 cannot be reached; unconfirmed.UNCONFIRMED['L7'] is unused")
def _(rig):
    raise AssertionError("unreachable")


@case("L8", "legacy IPC across hosts (two GB200 trays, one NVLink domain)",
      "flashinfer#2006, vLLM#52778", "gb200-nvl72:2", [(0, 0), (1, 0)],
      expect=E.cudaErrorInvalidResourceHandle)
def _(rig):
    exp, imp = rig[0], rig[1]
    assert exp.gethostname() != imp.gethostname()
    p = check("cudaMalloc", exp.cudaMalloc(MIB))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    res = imp.cudaIpcOpenMemHandle(h, LAZY)
    with pytest.raises(CudaError) as ei:
        check("cudaIpcOpenMemHandle", res)
    e = ei.value
    assert (e.code, e.name, e.string) == (400, "cudaErrorInvalidResourceHandle",
                                          "invalid resource handle")
    assert rig.held(1) == {}
    check("cudaFree", exp.cudaFree(p))
    return res


@case("L9", "open in the exporting process itself: invalid device context (201)",
      "ucx#11603, ucx#4431", "gb200-nvl72:1", [(0, 0)],
      expect=E.cudaErrorDeviceUninitialized)
def _(rig):
    d = rig[0]
    p = check("cudaMalloc", d.cudaMalloc(MIB))
    h = check("cudaIpcGetMemHandle", d.cudaIpcGetMemHandle(p))
    res = d.cudaIpcOpenMemHandle(h, LAZY)
    with pytest.raises(CudaError) as ei:
        check("cudaIpcOpenMemHandle", res)
    assert (ei.value.code, ei.value.string) == (201, "invalid device context")
    check("cudaFree", d.cudaFree(p))
    return res


def _l10(rig):
    exp, imp = rig[0], rig[1]
    assert check("cudaDeviceCanAccessPeer", imp.cudaDeviceCanAccessPeer(1, 0)) == 0
    p = check("cudaMalloc", exp.cudaMalloc(MIB))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    res = imp.cudaIpcOpenMemHandle(h, LAZY)
    with pytest.raises(CudaError) as ei:
        check("cudaIpcOpenMemHandle", res)
    assert ei.value.string == "peer access is not supported between these two devices"
    check("cudaFree", exp.cudaFree(p))
    return res


case("L10", "no P2P between the devices (GeForce RTX 4090)", "sglang#4814, nccl-tests#287",
     "rtx4090-8", [(0, 0), (0, 1)], expect=E.cudaErrorPeerAccessUnsupported)(_l10)
case("L10/edited", "no P2P between the devices (HGX H100 edited with modify.without_p2p)",
     "sglang#4814", lambda: modify.without_p2p(build("hgx-h100-8"), "hgx-h100-0", 0, 1),
     [(0, 0), (0, 1)], expect=E.cudaErrorPeerAccessUnsupported)(_l10)


@case("L12", "too many peer mappings (limit lowered to 1 for the case)", "cuda_runtime_api.h documented returns",
      "gb200-nvl72:1", [(0, 0), (0, 1)], expect=E.cudaErrorTooManyPeers, sim_only=True)
def _(rig):
    exp, imp = rig[0], rig[1]
    ps = [check("cudaMalloc", exp.cudaMalloc(4096)) for _ in range(2)]
    hs = [check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p)) for p in ps]
    saved = unconfirmed.MAX_PEER_MAPPINGS
    unconfirmed.MAX_PEER_MAPPINGS = 1
    try:
        q = check("cudaIpcOpenMemHandle", imp.cudaIpcOpenMemHandle(hs[0], LAZY))
        res = imp.cudaIpcOpenMemHandle(hs[1], LAZY)
    finally:
        unconfirmed.MAX_PEER_MAPPINGS = saved
    check("cudaIpcCloseMemHandle", imp.cudaIpcCloseMemHandle(q))
    for p in ps:
        check("cudaFree", exp.cudaFree(p))
    return res


@case("L13", "flags != cudaIpcMemLazyEnablePeerAccess", "cuda_runtime_api.h (flags must be the lazy flag)",
      "gb200-nvl72:1", [(0, 0), (0, 1)], expect=U("L13"))
def _(rig):
    exp, imp = rig[0], rig[1]
    p = check("cudaMalloc", exp.cudaMalloc(MIB))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    res = imp.cudaIpcOpenMemHandle(h, 0)
    assert rig.held(1) == {}
    check("cudaFree", exp.cudaFree(p))
    return res


@case("L14", "close unmaps only the caller's import: exporter and other importers unaffected",
      "cuda_runtime_api.h (CUDA 13.0)", "gb200-nvl72:1", [(0, 0), (0, 1), (0, 2)])
def _(rig):
    exp, i1, i2 = rig[0], rig[1], rig[2]
    p = check("cudaMalloc", exp.cudaMalloc(4096))
    check("write", rig.write(0, p, pattern(4096, 4)))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    q1 = check("cudaIpcOpenMemHandle", i1.cudaIpcOpenMemHandle(h, LAZY))
    q2 = check("cudaIpcOpenMemHandle", i2.cudaIpcOpenMemHandle(h, LAZY))
    res = i1.cudaIpcCloseMemHandle(q1)
    check("close", res)
    assert code_of(rig.kernel_read(1, q1, 16)) == int(E.cudaErrorIllegalAddress)
    assert check("read", rig.read(2, q2, 4096)) == pattern(4096, 4)
    assert check("read", rig.read(0, p, 4096)) == pattern(4096, 4)
    assert (rig.held(1), rig.held(2)) == ({}, {"ipc_mapping": 1})
    check("close", i2.cudaIpcCloseMemHandle(q2))
    check("cudaFree", exp.cudaFree(p))
    assert rig.flag_count() == 0
    return res


@case("L15", "exporter cudaFree while a peer has it open: flagged, the peer's access faults",
      "cuda_runtime_api.h (undefined); row L15", "gb200-nvl72:1", [(0, 0), (0, 1)],
      expect=E.cudaErrorIllegalAddress)
def _(rig):
    exp, imp = rig[0], rig[1]
    p = check("cudaMalloc", exp.cudaMalloc(4096))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    q = check("cudaIpcOpenMemHandle", imp.cudaIpcOpenMemHandle(h, LAZY))
    assert check("kernel", rig.kernel_read(1, q, 16)) == bytes(16)
    check("cudaFree", exp.cudaFree(p))   # the free itself succeeds: UB is the peer's problem
    assert rig.flagged("L15", 1)
    res = rig.kernel_read(1, q, 16)
    assert rig.flag_count("L15") == 2   # the free and the access
    assert rig.held(1) == {"ipc_mapping": 1}                 # the peer still holds its import
    check("close", imp.cudaIpcCloseMemHandle(q))
    return res


# ================ docs/driver-rules.md §2-3 VMM and handles (V), checks (X) ================

@case("V1", "cuMemCreate size not a multiple of the MINIMUM granularity",
      "cuda.h; fzyzcjy/torch_memory_saver#82", "hgx-h100-8", [(0, 0)],
      expect=R.CUDA_ERROR_INVALID_VALUE)
def _(rig):
    d = rig[0]
    res = d.cuMemCreate(gran(d) + 4096, alloc_prop(0, 0), 0)
    assert rig.held(0) == {}
    return res


@case("V2", "cuMemCreate(FABRIC) on a GB200 tray with IMEX", "cuda.h; row V2", "gb200-nvl72:1",
      [(0, 0)], expect=R.CUDA_SUCCESS)
def _(rig):
    d = rig[0]
    assert check("attr", d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0)) == 1
    assert d.imex_channels()
    res = d.cuMemCreate(gran(d, 0, FABRIC), alloc_prop(0, int(FABRIC)), 0)
    h = check("cuMemCreate", res)
    blob = check("export", d.cuMemExportToShareableHandle(h, FABRIC, 0))
    assert isinstance(blob, bytes) and len(blob) == FABRIC_HANDLE_SIZE
    assert rig.held(0) == {"vmm_handle": 1}
    check("cuMemRelease", d.cuMemRelease(h))
    return res


def _v3(rig):
    d = rig[0]
    g = gran(d)
    res = d.cuMemCreate(g, alloc_prop(0, int(FABRIC)), 0)
    h = check("cuMemCreate(POSIX_FD)", d.cuMemCreate(g, alloc_prop(0, int(FD)), 0))  # still ok
    check("cuMemRelease", d.cuMemRelease(h))
    return res


case("V3/imex", "cuMemCreate(FABRIC) on a tray without IMEX channel (modify.without_imex)",
     "write-up 70192288331, IMEX guide", lambda: modify.without_imex(
         build("gb200-nvl72:2"), "gb200-nvl72-tray00"), [(0, 0)],
     expect=R.CUDA_ERROR_NOT_PERMITTED)(_v3)


@case("V3/b200", "cuMemCreate(FABRIC) on DGX B200: attribute 128 says 1, no IMEX",
      "DeepEP#487", "dgx-b200-8", [(0, 0)], expect=R.CUDA_ERROR_NOT_PERMITTED)
def _(rig):
    d = rig[0]
    assert check("attr", d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0)) == 1
    return _v3(rig)


@case("V4", "cuMemCreate(FABRIC) where attribute 128 is 0", "cuda.h", lambda: build(
      "gb200-nvl72:1").replace_gpu(GpuRef("gb200-nvl72-tray00", 0), fabric_handle=False),
      [(0, 0)], expect=U("V4"))
def _(rig):
    d = rig[0]
    assert check("attr", d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0)) == 0
    return d.cuMemCreate(gran(d), alloc_prop(0, int(FABRIC)), 0)


def _export_fabric(rig, i: int = 0, fill: bytes | None = None):
    """Process i creates a FABRIC handle, maps it, optionally fills it; (handle, ptr, blob)."""
    d = rig[i]
    g = gran(d, 0, FABRIC)
    h = create(d, g, FABRIC)
    ptr = map_rw(d, h, g)
    if fill is not None:
        check("write", rig.write(i, ptr, fill))
    blob = check("export", d.cuMemExportToShareableHandle(h, FABRIC, 0))
    return h, ptr, blob, g


def _teardown_export(rig, i, h, ptr, g):
    unmap_free(rig[i], ptr, g)
    check("cuMemRelease", rig[i].cuMemRelease(h))


@case("V5", "FABRIC import on a tray without IMEX (exporter's tray has it)",
      "cuda.h (CUDA 13.0) cuMemImportFromShareableHandle; row V5", lambda: modify.without_imex(
          build("gb200-nvl72:2"), "gb200-nvl72-tray01"), [(0, 0), (1, 0)],
      expect=R.CUDA_ERROR_NOT_PERMITTED)
def _import_refused(rig):
    """Process 0 exports FABRIC memory, process 1's import is refused and holds nothing."""
    h, ptr, blob, g = _export_fabric(rig)
    res = rig[1].cuMemImportFromShareableHandle(blob, FABRIC)
    assert rig.held(1) == {}
    _teardown_export(rig, 0, h, ptr, g)
    return res


@case("V6", "FABRIC import on a GPU that does not support the type (attribute 128 = 0)",
      "cuda.h (CUDA 13.0); row V6", lambda: build("gb200-nvl72:2").replace_gpu(
          GpuRef("gb200-nvl72-tray01", 0), fabric_handle=False), [(0, 0), (1, 0)],
      expect=R.CUDA_ERROR_NOT_SUPPORTED)
def _(rig):
    h, ptr, blob, g = _export_fabric(rig)
    res = rig[1].cuMemImportFromShareableHandle(blob, FABRIC)
    _teardown_export(rig, 0, h, ptr, g)
    return res


def _two_domains():
    """gb200-nvl72:2 with each tray its own NVLink domain (different clusterUuid), the way
    two separate racks would look; NVML's fabric info follows the split."""
    c = build("gb200-nvl72:2")
    (dom,) = c.domains
    other = bytes(reversed(dom.cluster_uuid))
    t0 = tuple(m for m in dom.members if m.host == "gb200-nvl72-tray00")
    t1 = tuple(m for m in dom.members if m.host == "gb200-nvl72-tray01")
    c = dataclasses.replace(c, domains=(dataclasses.replace(dom, name="rack-a", members=t0),
                                        NvlinkDomain("rack-b", t1, other)))
    for ref in t1:
        c = c.replace_gpu(ref, fabric=dataclasses.replace(c.gpu(ref).fabric, cluster_uuid=other))
    return c


@case("V7", "FABRIC import from another NVLink domain (different clusterUuid): fails, flagged",
      "NVIDIA IMEX guide; row V7", _two_domains, [(0, 0), (1, 0)], expect=U("V7"))
def _(rig):
    u0 = check("nvml", rig[0].nvmlDeviceGetGpuFabricInfo(0)).cluster_uuid
    u1 = check("nvml", rig[1].nvmlDeviceGetGpuFabricInfo(0)).cluster_uuid
    assert u0 != u1 and any(u0) and any(u1)
    h, ptr, blob, g = _export_fabric(rig)
    res = rig[1].cuMemImportFromShareableHandle(blob, FABRIC)
    assert rig.flagged("V7", 1)
    assert rig.held(1) == {}
    _teardown_export(rig, 0, h, ptr, g)
    return res


@case("V8", "FABRIC across hosts in one domain: import ok, the importer sees the exporter's bytes",
      "cuda.h; row V8", "gb200-nvl72:2", [(0, 0), (1, 0)], expect=R.CUDA_SUCCESS)
def _(rig):
    exp, imp = rig[0], rig[1]
    assert exp.gethostname() != imp.gethostname()
    n = 1 << 16
    h, ptr, blob, g = _export_fabric(rig, 0, pattern(n, 5))
    res = imp.cuMemImportFromShareableHandle(blob, FABRIC)
    h2 = check("cuMemImportFromShareableHandle", res)
    q = map_rw(imp, h2, g)
    assert check("read", rig.read(1, q, n)) == pattern(n, 5)
    check("write", rig.write(1, q + n, pattern(n, 6)))                # importer writes
    assert check("read", rig.read(0, ptr + n, n)) == pattern(n, 6)  # exporter sees it
    # a device-to-device copy inside the importer's mapping
    check("cudaMemcpy", imp.cudaMemcpy(q + 4 * n, q, n, DTOD))
    assert check("read", rig.read(0, ptr + 4 * n, n)) == pattern(n, 5)
    assert rig.held(1) == {"imported_handle": 1, "reservation": 1, "vmm_mapping": 1}
    unmap_free(imp, q, g)
    check("cuMemRelease", imp.cuMemRelease(h2))
    _teardown_export(rig, 0, h, ptr, g)
    return res


@case("V9", "POSIX-fd handle to another host cannot be transported", "man 7 unix (SCM_RIGHTS); row V9",
      "gb200-nvl72:2", [(0, 0), (1, 0)])
def _(rig):
    d = rig[0]
    g = gran(d, 0, FD)
    h = create(d, g, FD)
    fd = check("export", d.cuMemExportToShareableHandle(h, FD, 0))
    with pytest.raises(FdTransportError, match="timed out connecting"):
        rig.pass_fd(0, fd, 1)
    assert rig.held(1) == {}
    assert rig.close_fd(0, fd) == 0
    res = d.cuMemRelease(h)
    return res


@case("V9/same-host", "POSIX-fd handle within a host: passes, the import maps the same bytes",
      "man 7 unix (SCM_RIGHTS)", "gb200-nvl72:2", [(0, 0), (0, 1)], expect=R.CUDA_SUCCESS)
def _(rig):
    exp, imp = rig[0], rig[1]
    d = exp
    g = gran(d, 0, FD)
    h = create(d, g, FD)
    ptr = map_rw(d, h, g)
    check("write", rig.write(0, ptr, pattern(4096, 7)))
    fd = check("export", d.cuMemExportToShareableHandle(h, FD, 0))
    fd1 = rig.pass_fd(0, fd, 1)
    res = imp.cuMemImportFromShareableHandle(fd1, FD)
    h1 = check("import", res)
    q = map_rw(imp, h1, g)
    assert check("read", rig.read(1, q, 4096)) == pattern(4096, 7)
    assert rig.held(1) == {"exported_fd": 1, "imported_handle": 1, "reservation": 1,
                           "vmm_mapping": 1}
    assert rig.close_fd(1, fd1) == 0 and rig.close_fd(0, fd) == 0
    unmap_free(imp, q, g)
    check("release", imp.cuMemRelease(h1))
    unmap_free(d, ptr, g)
    check("release", d.cuMemRelease(h))
    return res


@case("V9/fd-lifetime", "an exported POSIX fd keeps the memory alive after cuMemRelease",
      "cuda.h (CUDA 13.0) cuMemExportToShareableHandle ('once every shareable handle is closed "
      "and the allocation is released, the memory goes back to the OS')", "hgx-h100-8",
      [(0, 0), (0, 1)], expect=R.CUDA_SUCCESS)
def _(rig):
    d, imp = rig[0], rig[1]
    h = create(d, gran(d), FD)
    fd = check("export", d.cuMemExportToShareableHandle(h, FD, 0))
    fd1 = rig.pass_fd(0, fd, 1)
    check("release", d.cuMemRelease(h))          # the fds are still open
    res = imp.cuMemImportFromShareableHandle(fd1, FD)
    if int(res[0]) == 0:
        check("release", imp.cuMemRelease(res[1]))
    assert rig.close_fd(0, fd) == 0 and rig.close_fd(1, fd1) == 0
    return res


@case("S3", "cuMemSetAccess of a peer's memory without a P2P path (GeForce RTX 4090 pair)",
      "pytorch/pytorch#174030; docs/fidelity-rules.md row S3", "rtx4090-8", [(0, 0), (0, 1)],
      expect=R.CUDA_ERROR_INVALID_DEVICE)
def _(rig):
    d, imp = rig[0], rig[1]
    g = gran(d)
    h = create(d, g, FD)
    fd = check("export", d.cuMemExportToShareableHandle(h, FD, 0))
    fd1 = rig.pass_fd(0, fd, 1)
    ih = check("import", imp.cuMemImportFromShareableHandle(fd1, FD))
    ptr = map_rw(imp, ih, g, access=False)
    dev = check("cudaGetDevice", imp.cudaGetDevice())
    res = imp.cuMemSetAccess(ptr, g, [access_desc(dev)], 1)
    # Its own device's access to its own memory is granted as before.
    own = map_rw(d, h, g)
    unmap_free(d, own, g)
    unmap_free(imp, ptr, g)
    check("release", imp.cuMemRelease(ih))
    check("release", d.cuMemRelease(h))
    assert rig.close_fd(0, fd) == 0 and rig.close_fd(1, fd1) == 0
    return res


@case("V10", "cuMemMap onto a range that is already mapped", "cuda.h; row V10", "hgx-h100-8",
      [(0, 0)], expect=U("V10"))
def _(rig):
    d = rig[0]
    g = gran(d)
    h1, h2 = create(d, g), create(d, g)
    ptr = map_rw(d, h1, g)
    res = d.cuMemMap(ptr, g, 0, h2, 0)
    assert rig.held(0)["vmm_mapping"] == 1
    unmap_free(d, ptr, g)
    check("release", d.cuMemRelease(h1))
    check("release", d.cuMemRelease(h2))
    return res


@case("V10/unreserved", "cuMemMap onto a range that was never reserved", "cuda.h; row V10",
      "hgx-h100-8", [(0, 0)], expect=U("V10"))
def _(rig):
    d = rig[0]
    g = gran(d)
    h = create(d, g)
    ptr = check("reserve", d.cuMemAddressReserve(g, 0, 0, 0))
    res = d.cuMemMap(ptr + g, g, 0, h, 0)      # just past the reservation
    check("free", d.cuMemAddressFree(ptr, g))
    check("release", d.cuMemRelease(h))
    return res


@case("V11", "cuMemMap without cuMemSetAccess: device access faults (700)", "cuda.h; row V11",
      "hgx-h100-8", [(0, 0)], expect=E.cudaErrorIllegalAddress)
def _(rig):
    d = rig[0]
    g = gran(d)
    h = create(d, g)
    ptr = map_rw(d, h, g, access=False)
    res = rig.kernel_read(0, ptr, 64)
    check("cuMemSetAccess", d.cuMemSetAccess(ptr, g, [access_desc(0)], 1))
    assert check("kernel", rig.kernel_read(0, ptr, 64)) == bytes(64)
    unmap_free(d, ptr, g)
    check("release", d.cuMemRelease(h))
    return res


@case("V12", "cuMemUnmap of a sub-range of a mapping", "cuda.h; row V12", "hgx-h100-8", [(0, 0)],
      expect=U("V12"))
def _(rig):
    d = rig[0]
    g = gran(d)
    h = create(d, 2 * g)
    ptr = map_rw(d, h, 2 * g)
    res = d.cuMemUnmap(ptr, g)
    assert rig.held(0)["vmm_mapping"] == 1
    unmap_free(d, ptr, 2 * g)
    check("release", d.cuMemRelease(h))
    return res


@case("V13", "cuMemRelease while mapped: still readable, memory freed after the last unmap",
      "cuda.h; row V13", "hgx-h100-8", [(0, 0)], expect=R.CUDA_SUCCESS)
def _(rig):
    d = rig[0]
    g = gran(d)
    h = create(d, g)
    ptr = map_rw(d, h, g)
    check("write", rig.write(0, ptr, pattern(4096, 8)))
    res = d.cuMemRelease(h)
    check("cuMemRelease", res)
    assert rig.held(0) == {"reservation": 1, "vmm_mapping": 1}
    assert check("read", rig.read(0, ptr, 4096)) == pattern(4096, 8)
    assert rig.live_allocs() == 1
    check("cuMemUnmap", d.cuMemUnmap(ptr, g))
    assert rig.live_allocs() == 0
    check("free", d.cuMemAddressFree(ptr, g))
    return res


@case("V14", "every import needs its own cuMemRelease; memory lives until the last",
      "cuda.h (CUDA 13.0); row V14", "gb200-nvl72:2", [(0, 0), (1, 1)], expect=R.CUDA_SUCCESS)
def _(rig):
    d, imp = rig[0], rig[1]
    g = gran(d, 0, FABRIC)
    h = create(d, g, FABRIC)
    blob = check("export", d.cuMemExportToShareableHandle(h, FABRIC, 0))
    a = check("import", imp.cuMemImportFromShareableHandle(blob, FABRIC))
    b = check("import", imp.cuMemImportFromShareableHandle(blob, FABRIC))
    assert a != b and rig.held(1) == {"imported_handle": 2}
    check("release", d.cuMemRelease(h))
    check("release", imp.cuMemRelease(a))
    assert rig.live_allocs() == 1              # b still holds it
    res = imp.cuMemRelease(b)
    assert rig.live_allocs() == 0
    return res


@case("V15", "cuMemAddressFree with a size other than the reservation", "cuda.h; row V15",
      "hgx-h100-8", [(0, 0)], expect=U("V15"))
def _(rig):
    d = rig[0]
    g = gran(d)
    ptr = check("reserve", d.cuMemAddressReserve(2 * g, 0, 0, 0))
    res = d.cuMemAddressFree(ptr, g)
    assert rig.held(0) == {"reservation": 1}
    check("free", d.cuMemAddressFree(ptr, 2 * g))
    return res


@case("X1", "export of a handle type not requested at cuMemCreate", "cuda.h", "gb200-nvl72:1",
      [(0, 0)], expect=U("X1"))
def _(rig):
    d = rig[0]
    h = create(d, gran(d), FD)
    res = d.cuMemExportToShareableHandle(h, FABRIC, 0)
    check("release", d.cuMemRelease(h))
    return res


@case("X2", "cuMemCreate(FABRIC) while the GPU's fabric state is IN_PROGRESS",
      "nvml.h; rows F1, M3", lambda: modify.with_fabric_state(
          build("gb200-nvl72:1"), GpuRef("gb200-nvl72-tray00", 0), FabricState.IN_PROGRESS),
      [(0, 0)], expect=U("X2"))
def _(rig):
    d = rig[0]
    assert check("nvml", d.nvmlDeviceGetGpuFabricInfo(0)).state == int(FabricState.IN_PROGRESS)
    return d.cuMemCreate(gran(d), alloc_prop(0, int(FABRIC)), 0)


def _split_hgx():
    """hgx-h100-8 with two NVSwitch domains (GPUs 0-3, 4-7) on one host."""
    c = build("hgx-h100-8")
    (dom,) = c.domains
    return dataclasses.replace(c, domains=(
        dataclasses.replace(dom, name="left", members=dom.members[:4]),
        NvlinkDomain("right", dom.members[4:])))


@case("X3", "cuMulticastAddDevice of a GPU outside the creator's NVSwitch domain", "cuda.h",
      _split_hgx, [(0, 0)], expect=U("X3"))
def _(rig):
    d = rig[0]
    mg = check("gran", d.cuMulticastGetGranularity(multicast_prop(2, 0), 0))
    mc = check("cuMulticastCreate", d.cuMulticastCreate(multicast_prop(2, mg, int(FD))))
    check("add", d.cuMulticastAddDevice(mc, 1))
    res = d.cuMulticastAddDevice(mc, 4)
    check("release", d.cuMemRelease(mc))
    return res


@case("X4", "POSIX-fd import of a descriptor this process does not hold", "man 7 unix (SCM_RIGHTS)",
      "hgx-h100-8", [(0, 0), (0, 1)], expect=U("X4"))
def _(rig):
    d = rig[0]
    h = create(d, gran(d), FD)
    fd = check("export", d.cuMemExportToShareableHandle(h, FD, 0))
    res = rig[1].cuMemImportFromShareableHandle(fd, FD)   # the number, not passed over a socket
    assert rig.close_fd(0, fd) == 0
    check("release", d.cuMemRelease(h))
    return res


# ========================= docs/driver-rules.md §4 Multicast (M) ==========================

def _m1(rig):
    d = rig[0]
    assert check("attr", d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0)) == 0
    return d.cuMulticastCreate(multicast_prop(2, 2 * MIB, int(FD)))


case("M1", "cuMulticastCreate without multicast support (8 x L40S PCIe)", "multicast needs an NVSwitch (FlashInfer, vLLM checks); row M1",
     "l40s-8-pcie", [(0, 0)], expect=U("M1"))(_m1)
case("M1/a100", "cuMulticastCreate without multicast support (A100 NVLink-bridge pairs)",
     "vLLM flashinfer_all_reduce.py note; row M1", "a100-pcie-bridge-8", [(0, 0)],
     expect=U("M1"))(_m1)


N_HGX = 8
HGX8 = [(0, g) for g in range(N_HGX)]


@case("M2", "multicast on HGX: 8 processes add their device, bind, map; multimem sees all ranks",
      "cuda.h (CUDA 13.0), FlashInfer SymmDeviceMemory; row M2", "hgx-h100-8", HGX8, expect=R.CUDA_SUCCESS)
def _(rig):
    n = len(rig)
    mg = check("gran", rig[0].cuMulticastGetGranularity(multicast_prop(n, 0), 1))
    fds: list[int] = [None] * n     # the multicast fd each rank holds
    results = []
    arrived = {"bound": 0, "read": 0}

    def barrier(what: str):   # what a CPU-group barrier gives FlashInfer's setup
        arrived[what] += 1
        wait_until(lambda: arrived[what] == n, f"all ranks {what}")

    def rank(r: int):
        d = rig[r]
        if r == 0:   # rank 0 creates and exports; the fd reaches the others over AF_UNIX
            mc = check("cuMulticastCreate", d.cuMulticastCreate(multicast_prop(n, mg, int(FD))))
            fd = check("export", d.cuMemExportToShareableHandle(mc, FD, 0))
            fds[0] = fd
            for peer in range(1, n):
                fds[peer] = rig.pass_fd(0, fd, peer)
        else:
            wait_until(lambda: fds[r] is not None, "multicast fd from rank 0")
            mc = check("import", d.cuMemImportFromShareableHandle(fds[r], FD))
        check("add", d.cuMulticastAddDevice(mc, r))            # its own device only
        mem = create(d, mg)
        uni = map_rw(d, mem, mg)
        check("write", rig.write(r, uni, np.full(256, r + 1, np.float32)))
        res = d.cuMulticastBindMem(mc, 0, mem, 0, mg, 0)       # blocks until all joined (M2)
        check("bind", res)
        results.append(res)
        mptr = map_rw(d, mc, mg)                               # blocks until all joined too
        barrier("bound")
        views = check("multimem", rig.multimem_read(r, mptr, np.float32, 256))
        assert len(views) == n
        assert sorted(float(v[0]) for v in views) == [float(k + 1) for k in range(n)]
        assert all((v == v[0]).all() for v in views)
        assert float(sum(views)[0]) == n * (n + 1) / 2          # what a multimem.ld_reduce sums
        assert rig.held(r) == {("multicast" if r == 0 else "imported_handle"): 1,
                               "vmm_handle": 1, "reservation": 2, "vmm_mapping": 2,
                               "multicast_binding": 1, "exported_fd": 1}
        # teardown in FlashInfer's order: barrier, unbind, unmap mc, unmap unicast,
        # release mc, release unicast
        barrier("read")
        check("unbind", d.cuMulticastUnbind(mc, r, 0, mg))
        unmap_free(d, mptr, mg)
        unmap_free(d, uni, mg)
        check("release mc", d.cuMemRelease(mc))
        check("release mem", d.cuMemRelease(mem))
        assert rig.close_fd(r, fds[r]) == 0
        return r

    outs = rig.run_ranks(rank, seed=7)
    assert [o.unwrap() for o in outs] == list(range(n))
    assert len(results) == n
    return results[0]


@case("M2/hang", "bind before every device joined, one rank never adds: diagnosed hang",
      "cuda.h (CUDA 13.0); row M2", "hgx-h100-8", HGX8, sim_only=True)
def _(rig):
    n = len(rig)
    mg = check("gran", rig[0].cuMulticastGetGranularity(multicast_prop(n, 0), 1))
    d0 = rig[0]
    mc0 = check("create", d0.cuMulticastCreate(multicast_prop(n, mg, int(FD))))
    fd0 = check("export", d0.cuMemExportToShareableHandle(mc0, FD, 0))
    held: dict[int, tuple] = {}

    def rank(r: int):
        d = rig[r]
        if r == 0:
            mc = mc0
        else:
            mc = check("import", d.cuMemImportFromShareableHandle(rig.pass_fd(0, fd0, r), FD))
        if r == n - 1:
            held[r] = (mc, None)
            return "never added its device"
        check("add", d.cuMulticastAddDevice(mc, r))
        mem = create(d, mg)
        held[r] = (mc, mem)
        d.cuMulticastBindMem(mc, 0, mem, 0, mg, 0)   # blocks forever: rank 7 never joins
        return "bound"

    outs = rig.run_ranks(rank, seed=3)
    assert outs[n - 1].value == "never added its device"
    for o in outs[:-1]:
        assert isinstance(o.error, HangDetected), o
        assert "cuMulticastBindMem" in str(o.error) and "7 of 8 devices added" in str(o.error)
        assert "M2" in str(o.error)
    # teardown from outside the ranks: nothing was bound
    for r, (mc, mem) in held.items():
        check("release mc", rig[r].cuMemRelease(mc))
        if mem is not None:
            check("release mem", rig[r].cuMemRelease(mem))
    for r in range(n):
        for it in list(rig.ledger(r)):
            if it.kind == "exported_fd":
                assert rig.close_fd(r, it.key) == 0
    return (R.CUDA_SUCCESS,)


def _one_device_mc(d, size_granules: int = 1):
    mg = check("gran", d.cuMulticastGetGranularity(multicast_prop(1, 0), 0))
    mc = check("create", d.cuMulticastCreate(multicast_prop(1, size_granules * mg, int(FD))))
    check("add", d.cuMulticastAddDevice(mc, 0))
    mem = create(d, size_granules * mg)
    return mg, mc, mem


@case("M3", "cuMulticastBindMem while the fabric manager is not done (state IN_PROGRESS)",
      "cuda.h (CUDA 13.0); row M3", lambda: modify.with_fabric_state(
          build("hgx-h100-8"), GpuRef("hgx-h100-0", 0), FabricState.IN_PROGRESS),
      [(0, 0)], expect=R.CUDA_ERROR_SYSTEM_NOT_READY)
def _(rig):
    d = rig[0]
    mg, mc, mem = _one_device_mc(d)
    res = d.cuMulticastBindMem(mc, 0, mem, 0, mg, 0)
    assert "multicast_binding" not in rig.held(0)
    check("release", d.cuMemRelease(mc))
    check("release", d.cuMemRelease(mem))
    return res


@case("M5", "multicast bind offset off the multicast MINIMUM granularity",
      "cuda.h; NCCL src/transport/nvls.cc", "hgx-h100-8", [(0, 0)], expect=R.CUDA_ERROR_INVALID_VALUE)
def _(rig):
    d = rig[0]
    mg, mc, mem = _one_device_mc(d, 2)
    res = d.cuMulticastBindMem(mc, 4096, mem, 0, mg, 0)
    check("release", d.cuMemRelease(mc))
    check("release", d.cuMemRelease(mem))
    return res


@case("M5/size", "multicast bind of a size off the multicast granularity (NCCL's user-buffer "
      "registration meets this)", "NCCL src/transport/nvls.cc", "hgx-h100-8", [(0, 0)],
      expect=R.CUDA_ERROR_INVALID_VALUE)
def _(rig):
    d = rig[0]
    mg, mc, mem = _one_device_mc(d, 2)
    res = d.cuMulticastBindMem(mc, 0, mem, 0, mg + mg // 2, 0)
    assert "multicast_binding" not in rig.held(0)
    check("release", d.cuMemRelease(mc))
    check("release", d.cuMemRelease(mem))
    return res


@case("M6", "cuMulticastUnbind with a size other than bound (undefined: flagged)",
      "cuda.h; row M6", "hgx-h100-8", [(0, 0)], expect=U("M6"))
def _(rig):
    d = rig[0]
    mg, mc, mem = _one_device_mc(d, 2)
    check("bind", d.cuMulticastBindMem(mc, 0, mem, 0, 2 * mg, 0))
    res = d.cuMulticastUnbind(mc, 0, 0, mg)
    assert rig.flagged("M6", 0)
    assert rig.held(0)["multicast_binding"] == 1
    check("unbind", d.cuMulticastUnbind(mc, 0, 0, 2 * mg))
    check("release", d.cuMemRelease(mc))
    check("release", d.cuMemRelease(mem))
    return res


# ====================== docs/driver-rules.md §5 NVML fabric info (F) ======================

@case("nvml-fabric-info", "NVML fabric info on GB200 trays: one cluster UUID, clique, COMPLETED",
      "NVIDIA/nccl@5067397 nvmlwrap.h; NVIDIA Multi-Node Tuning Guide", "gb200-nvl72:2", [(0, 0), (1, 3)])
def _(rig):
    infos = [check("nvml", rig[i].nvmlDeviceGetGpuFabricInfo(g)) for i, g in ((0, 0), (1, 3))]
    for f in infos:
        assert len(f.cluster_uuid) == 16 and any(f.cluster_uuid)
        assert (f.state, f.status, f.clique_id) == (int(FabricState.COMPLETED), 0, 1)
    assert infos[0].cluster_uuid == infos[1].cluster_uuid
    return (0,)


@case("F1", "NVML reports the fabric state a GPU is in (IN_PROGRESS)", "nvml.h; row F1",
      lambda: modify.with_fabric_state(build("gb200-nvl72:1"), GpuRef("gb200-nvl72-tray00", 2),
                                       FabricState.IN_PROGRESS, status_ok=False), [(0, 0)])
def _(rig):
    d = rig[0]
    assert check("nvml", d.nvmlDeviceGetGpuFabricInfo(2)).state == int(FabricState.IN_PROGRESS)
    assert check("nvml", d.nvmlDeviceGetGpuFabricInfo(0)).state == int(FabricState.COMPLETED)
    assert check("nvml", d.nvmlDeviceGetGpuFabricInfo(2)).status != 0
    assert d.nvmlDeviceGetGpuFabricInfo(4)[0] != 0     # no such GPU on the tray
    return (0,)


@case("F2", "single-node NVSwitch board: state COMPLETED with an all-zero cluster UUID",
      "NVIDIA/nccl src/mnnvl.cc; row F2", "hgx-h100-8", [(0, 0)])
def _(rig):
    f = check("nvml", rig[0].nvmlDeviceGetGpuFabricInfo(0))
    assert (f.cluster_uuid, f.state) == (bytes(16), int(FabricState.COMPLETED))
    return (0,)


@case("F3", "GB200 NVL36x2: same cluster UUID, different clique across the racks",
      "NVIDIA/nccl@5067397 mnnvl.cc; row F3", "gb200-nvl36x2:10", [(0, 0), (9, 0)])
def _(rig):
    a = check("nvml", rig[0].nvmlDeviceGetGpuFabricInfo(0))
    b = check("nvml", rig[1].nvmlDeviceGetGpuFabricInfo(0))
    assert a.cluster_uuid == b.cluster_uuid and a.clique_id != b.clique_id
    return (0,)


@case("B3", "nvmlDeviceGetP2PStatus(NVLINK): OK on NVSwitch / bridge pairs, not on PCIe",
      "vLLM custom_all_reduce.py is_fully_connected", "a100-pcie-bridge-8", [(0, 0)])
def _(rig):
    d = rig[0]
    assert check("nvml", d.nvmlDeviceGetP2PStatus(0, 1)) == NVML_P2P_STATUS_OK      # NV12 bridge
    assert check("nvml", d.nvmlDeviceGetP2PStatus(0, 2)) == NVML_P2P_STATUS_NOT_SUPPORTED  # PCIe
    assert check("peer", d.cudaDeviceCanAccessPeer(0, 2)) == 1     # PCIe P2P, same socket
    assert check("peer", d.cudaDeviceCanAccessPeer(0, 4)) == 0     # cross socket
    return (0,)


def _p2p_all(expect_status):
    def body(rig):
        d = rig[0]
        n = check("count", d.cudaGetDeviceCount())
        assert all(check("nvml", d.nvmlDeviceGetP2PStatus(0, j)) == expect_status
                   for j in range(1, n))
        return (0,)
    return body


case("B3/nvswitch", "nvmlDeviceGetP2PStatus(NVLINK) on HGX H100: OK for every pair",
     "vLLM custom_all_reduce.py is_fully_connected", "hgx-h100-8", [(0, 0)])(_p2p_all(NVML_P2P_STATUS_OK))
case("B3/pcie", "nvmlDeviceGetP2PStatus(NVLINK) on L40S PCIe: NOT_SUPPORTED for every pair",
     "vLLM custom_all_reduce.py is_fully_connected", "l40s-8-pcie", [(0, 0)])(_p2p_all(NVML_P2P_STATUS_NOT_SUPPORTED))


# ===================== docs/library-rules.md §2 teardown (G) / ledger =====================

@case("ledger/exit", "process exit with residue: exit_process reports each leak and its call site",
      "vLLM#46515 (row G5)", "gb200-nvl72:1", [(0, 0), (0, 1)], sim_only=True)
def _(rig):
    exp, imp = rig[0], rig[1]
    p = check("cudaMalloc", exp.cudaMalloc(4096))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    check("open", imp.cudaIpcOpenMemHandle(h, LAZY))
    check("cudaMalloc", imp.cudaMalloc(4096))
    g = gran(imp)
    mem = create(imp, g)
    map_rw(imp, mem, g)
    leaks = rig.exit_process(1)
    assert len(leaks) == 5, leaks
    kinds = sorted(line.split(":")[0] for line in leaks)
    assert kinds == ["allocation", "ipc_mapping", "reservation", "vmm_handle", "vmm_mapping"]
    assert all("test_rules.py:" in line for line in leaks), leaks
    assert rig.held(1) == {} and rig.live_allocs() == 1     # only the exporter's block
    assert int(imp.cudaMalloc(16)[0]) == int(E.cudaErrorCudartUnloading)   # the process is gone
    check("cudaFree", exp.cudaFree(p))
    assert rig.exit_process(0) == []                         # the exporter exits clean
    return (0,)


# ============================ the fidelity rules: docs/fidelity-rules.md ==========================

def _pair_link(preset: str, i: int, j: int, **facts):
    """`preset` with the link GPU i-GPU j of its first host changed (both directions)."""
    def build_it():
        c = build(preset)
        h = c.hosts[0]
        rows = [list(r) for r in h.links]
        rows[i][j] = dataclasses.replace(h.link(i, j), **facts)
        rows[j][i] = dataclasses.replace(h.link(j, i), **facts)
        return c.replace_host(h.name, links=tuple(tuple(r) for r in rows))
    return build_it


def _ipc_round_trip(rig, n: int = 4096):
    """Process 0 exports a buffer, process 1 opens it: the open's result, and the handle."""
    p = check("cudaMalloc", rig[0].cudaMalloc(n))
    h = check("cudaIpcGetMemHandle", rig[0].cudaIpcGetMemHandle(p))
    return p, h, rig[1].cudaIpcOpenMemHandle(h, LAZY)


def _p2p_reported(rig) -> None:
    assert check("cuDeviceCanAccessPeer", rig[1].cuDeviceCanAccessPeer(1, 0)) == 1


@case("P1", "ACS redirect: P2P reported, IPC open refused with PeerAccessUnsupported",
      "ray-project/ray#16979 (NCCL p2p.cc 'failed to open CUDA IPC handle : 217'); NCCL "
      "troubleshooting 'PCI Access Control Services'; row P1",
      _pair_link("rtx-pro-6000-4", 0, 1, ipc_refused="acs"), [(0, 0), (0, 1)],
      expect=E.cudaErrorPeerAccessUnsupported)
def _(rig):
    _p2p_reported(rig)
    p, _, res = _ipc_round_trip(rig)
    assert rig.held(1) == {}
    check("cudaFree", rig[0].cudaFree(p))
    return res


@case("P2", "IOMMU translation: P2P reported, IPC open answers InvalidDevice",
      "NVIDIA/TensorRT-LLM#17034 (101 from cudaIpcOpenMemHandle, can_access_peer True); row P2",
      _pair_link("rtx-pro-6000-4", 0, 1, ipc_refused="iommu"), [(0, 0), (0, 1)],
      expect=E.cudaErrorInvalidDevice)
def _(rig):
    _p2p_reported(rig)
    p, _, res = _ipc_round_trip(rig)
    check("cudaFree", rig[0].cudaFree(p))
    return res


def _p3(rig):
    """The functional probe serving stacks run: the importer writes a pattern through the
    peer mapping, the owner reads its own memory (vLLM gpu_p2p_access_check)."""
    _p2p_reported(rig)
    p, _, res = _ipc_round_trip(rig)
    q = check("cudaIpcOpenMemHandle", res)
    check("write", rig.write(1, q, pattern(4096, 21)))          # every call succeeds
    got = check("read", rig.read(0, p, 4096))
    check("cudaIpcCloseMemHandle", rig[1].cudaIpcCloseMemHandle(q))
    check("cudaFree", rig[0].cudaFree(p))
    return res, got


@case("P3/dropped", "patched P2P: peer writes silently dropped; the probe's bytes differ",
      "aikitoria/open-gpu-kernel-modules#8 (simpleP2P verification fails); row P3",
      _pair_link("rtx5090-2", 0, 1, p2p=True, peer_writes="dropped"), [(0, 0), (0, 1)],
      expect=E.cudaSuccess, sim_only=True)
def _(rig):
    res, got = _p3(rig)
    assert got != pattern(4096, 21) and got == bytes(4096)
    return res


@case("P3/corrupt", "patched P2P: peer writes land corrupted, no error code",
      "noonghunna/club-3090#922; NVIDIA/open-gpu-kernel-modules#1257; row P3",
      _pair_link("rtx3090-2-nvlink", 0, 1, peer_writes="corrupt"), [(0, 0), (0, 1)],
      expect=E.cudaSuccess, sim_only=True)
def _(rig):
    res, got = _p3(rig)
    assert got != pattern(4096, 21)
    return res


@case("N1", "P2P disabled with NVLinks up: CanAccessPeer 0, NVML NVLink status still OK",
      "NVIDIA/TensorRT-LLM#1374; row N1",
      lambda: build("hgx-h100-8").set_p2p("hgx-h100-0", 0, 1, False), [(0, 0)],
      expect=E.cudaSuccess)
def _(rig):
    d = rig[0]
    assert check("cuDeviceCanAccessPeer", d.cuDeviceCanAccessPeer(0, 1)) == 0
    assert check("nvml", d.nvmlDeviceGetP2PStatus(0, 1)) == NVML_P2P_STATUS_OK
    assert check("nvml", d.nvmlDeviceGetNvLinkState(0)) is True
    return (E.cudaSuccess,)


@case("N2", "NVLinks down with PCIe P2P: CanAccessPeer 1, NVML NVLink status NOT_SUPPORTED",
      "FlashInfer/TRT-LLM read nvmlDeviceGetNvLinkState; row N2",
      lambda: modify.with_nvlinks_down(build("hgx-h100-8"), GpuRef("hgx-h100-0", 1)), [(0, 0)],
      expect=E.cudaSuccess)
def _(rig):
    d = rig[0]
    assert check("cuDeviceCanAccessPeer", d.cuDeviceCanAccessPeer(0, 1)) == 1
    assert check("nvml", d.nvmlDeviceGetP2PStatus(0, 1)) == NVML_P2P_STATUS_NOT_SUPPORTED
    assert check("nvml", d.nvmlDeviceGetP2PStatus(0, 2)) == NVML_P2P_STATUS_OK
    assert check("nvml", d.nvmlDeviceGetNvLinkState(1)) is False
    return (E.cudaSuccess,)


@case("T2", "a four-GPU NV6 mesh (H200 NVL 4-way bridge) has no multicast",
      "NVIDIA/nccl#1617 (4 GPUs NV6 all pairs); rows T2, MC1", "h200-nvl-4way-8", [(0, 0)],
      expect=U("M1"))
def _(rig):
    return _m1(rig)


def _split_imex():
    """gb200-nvl72:2 as one NVLink domain whose trays are two IMEX domains (row I2)."""
    c = build("gb200-nvl72:2")
    return dataclasses.replace(c, imex_domains=(ImexDomain("imex-a", ("gb200-nvl72-tray00",)),
                                                ImexDomain("imex-b", ("gb200-nvl72-tray01",))))


@case("I2", "a node-local IMEX channel: a process re-imports its own FABRIC handle",
      "meta-pytorch/torchcomms#3517 (the self-trial succeeds); row I2", _split_imex, [(0, 0)],
      expect=R.CUDA_SUCCESS)
def _(rig):
    h, ptr, blob, g = _export_fabric(rig)
    res = rig[0].cuMemImportFromShareableHandle(blob, FABRIC)
    check("cuMemRelease", rig[0].cuMemRelease(check("import", res)))
    _teardown_export(rig, 0, h, ptr, g)
    return res


@case("I3", "FABRIC import from a tray in another IMEX domain, same NVLink domain",
      "meta-pytorch/torchcomms#3517; kubernetes-sigs/dra-driver-nvidia-gpu#294; row I3",
      _split_imex, [(0, 0), (1, 0)], expect=U("I3"))
def _(rig):
    assert (check("nvml", rig[0].nvmlDeviceGetGpuFabricInfo(0)).cluster_uuid ==
            check("nvml", rig[1].nvmlDeviceGetGpuFabricInfo(0)).cluster_uuid)
    return _import_refused(rig)


@case("I1/W5", "a container without the IMEX channel device: cuMemCreate(FABRIC) NOT_PERMITTED",
      "CUDA driver API VA docs (IMEX channel files), microsoft/mscclpp#467; rows I1, W5",
      lambda: build("gb200-nvl72:1").replace_host(
          "gb200-nvl72-tray00", container=ContainerCaps(imex_channel_dev=False)),
      [(0, 0)], expect=R.CUDA_ERROR_NOT_PERMITTED)
def _(rig):
    d = rig[0]
    return d.cuMemCreate(gran(d, 0, FABRIC), alloc_prop(0, int(FABRIC)), 0)


def _containers(preset: str = "hgx-h100-8"):
    """`preset` with each process of its first host in a container of its own (row W6)."""
    def build_it():
        c = build(preset)
        return c.replace_host(c.hosts[0].name, container=ContainerCaps(container_per_process=True))
    return build_it


# A real-GPU rig runs its workers in one set of namespaces; containers are the simulator's.
@case("W6/same-node", "containers on one host: each process has its own /dev/shm, so a "
      "same-node test through shared memory sees different nodes",
      "NVIDIA/nccl#1647 (NCCL sees containers as separate nodes); NVIDIA/nccl#248 (NCCL keys "
      "SHM on the /dev/shm device); pytorch/pytorch#1158 (--ipc=host shares the host's); row W6",
      _containers(), [(0, 0), (0, 1)], sim_only=True)
def _(rig):
    assert rig[0].gethostname() == rig[1].gethostname()
    assert rig[0].shm_namespace() != rig[1].shm_namespace()
    return (E.cudaSuccess,)


@case("W6/ipc", "legacy IPC open between containers of one host (own pid / IPC namespaces)",
      "NVIDIA/nccl#360 (no inter-container CUDA IPC: the driver checks the peer pid); "
      "vllm-project/vllm#55906 ('invalid device context' with isolated pid namespaces); row W6",
      _containers(), [(0, 0), (0, 1)], expect=U("W6"), sim_only=True)
def _(rig):
    p, _h, res = _ipc_round_trip(rig)
    assert rig.held(1) == {}
    check("cudaFree", rig[0].cudaFree(p))
    return res


@case("W6/fd", "POSIX fd to a process in another container of one host: no socket path",
      "man 7 unix (the socket path lives in the sender's filesystem); row V9 by analogy; openucx/ucx#11546 "
      "(sharing needs a bind-mounted directory); row W6",
      _containers(), [(0, 0), (0, 1)], sim_only=True)
def _(rig):
    def send(fd: int) -> None:
        with pytest.raises(FdTransportError, match="timed out connecting.*another container"):
            rig.pass_fd(0, fd, 1)
    return _fd_refused(rig, send)


def _fd_refused(rig, attempt):
    """Process 0 exports a POSIX-fd handle; `attempt(fd)` tries to get it to process 1 (and
    asserts the refusal); process 1 holds nothing afterwards; the cuMemRelease result."""
    d = rig[0]
    h = create(d, gran(d, 0, FD), FD)
    fd = check("export", d.cuMemExportToShareableHandle(h, FD, 0))
    attempt(fd)
    assert rig.held(1) == {}
    assert rig.close_fd(0, fd) == 0
    return d.cuMemRelease(h)


@case("W6/pidfd", "pidfd_open of a process in another container of one host: ESRCH",
      "man 2 pidfd_open (ESRCH: no such process in the caller's pid namespace); openucx/ucx#11978 "
      "(UCX refuses pidfd_getfd across pid namespaces); row W6",
      _containers(), [(0, 0), (0, 1)], sim_only=True)
def _(rig):
    from commsim.sim.fd_channel import SimFdChannel

    def pull(fd: int) -> None:
        with pytest.raises(FdTransportError, match="ESRCH") as err:
            SimFdChannel(rig[1]).pull(rig.pid(0), fd)
        assert err.value.errno == 3
    return _fd_refused(rig, pull)


@case("W6/one-container", "without the fact, one host is one namespace: IPC opens as before",
      "row W6 (the control)", "hgx-h100-8", [(0, 0), (0, 1)], expect=E.cudaSuccess)
def _(rig):
    assert rig[0].shm_namespace() == rig[1].shm_namespace()
    p, _h, res = _ipc_round_trip(rig)
    check("cudaIpcCloseMemHandle", rig[1].cudaIpcCloseMemHandle(res[1]))
    check("cudaFree", rig[0].cudaFree(p))
    return res


@case("MC2", "cuMulticastAddDevice after a bind: ILLEGAL_STATE",
      "CUDA driver API (all devices before any bind); NVIDIA/nccl#1788 (401); row MC2",
      "hgx-h100-8", [(0, 0)], expect=R.CUDA_ERROR_ILLEGAL_STATE)
def _(rig):
    d, g = rig[0], 2 * MIB
    mc, h = _bound_team_of_one(d, g)
    res = d.cuMulticastAddDevice(mc, 1)
    _unbind_release(d, mc, h, g)
    return res


def _bound_team_of_one(d, g: int):
    """A multicast object for one device, that device added and `g` bytes bound."""
    mc = check("cuMulticastCreate", d.cuMulticastCreate(multicast_prop(1, g, 0)))
    check("cuMulticastAddDevice", d.cuMulticastAddDevice(mc, 0))
    h = create(d, g)
    check("cuMulticastBindMem", d.cuMulticastBindMem(mc, 0, h, 0, g, 0))
    return mc, h


def _unbind_release(d, mc: int, h: int, g: int) -> None:
    check("cuMulticastUnbind", d.cuMulticastUnbind(mc, 0, 0, g))
    check("cuMemRelease", d.cuMemRelease(h))
    check("cuMemRelease", d.cuMemRelease(mc))


@case("MC3/W4", "a container without /dev/nvidia-caps: cuMulticastCreate INVALID_VALUE",
      "pie-project/pie#500; NVIDIA/nccl#1672 (nvls.cc:251 'invalid argument'); rows MC3, W4",
      lambda: build("hgx-h200-8").replace_host("hgx-h200-0", container=ContainerCaps(nvidia_caps=False)),
      [(0, 0)], expect=R.CUDA_ERROR_INVALID_VALUE)
def _(rig):
    d = rig[0]
    assert check("attr", d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0)) == 1
    return d.cuMulticastCreate(multicast_prop(2, 2 * MIB, int(FD)))


@case("MC4", "fabric multicast (FABRIC handle type) without an IMEX channel",
      "NVIDIA/nvbandwidth#35 (multicast tests need IMEX); row MC4", "hgx-h100-8", [(0, 0)],
      expect=U("MC4"))
def _(rig):
    return rig[0].cuMulticastCreate(multicast_prop(2, 2 * MIB, int(FABRIC)))


@case("MC7", "plain load through a multicast address: undefined, flagged, no error code",
      "PTX ISA 'only multimem.* on multimem addresses' (NVIDIA/nccl#1230); row MC7",
      "hgx-h100-8", [(0, 0)], expect=E.cudaSuccess, sim_only=True)
def _(rig):
    d, g = rig[0], 2 * MIB
    mc, h = _bound_team_of_one(d, g)
    va = map_rw(d, mc, g)
    res = rig.kernel_read(0, va, 64)
    assert rig.flagged("MC7", 0)
    unmap_free(d, va, g)
    _unbind_release(d, mc, h, g)
    return res


@case("MC6", "a multimem kernel over multicast address 0: illegal address, sticky",
      "CUDA runtime docs (700 leaves the context unusable); pytorch/pytorch#195596; row MC6",
      "hgx-h100-8", [(0, 0)], expect=E.cudaErrorIllegalAddress, sim_only=True)
def _(rig):
    res = rig.multimem_read(0, 0, np.float32, 16)
    later = rig[0].cudaMalloc(4096)                       # every later call: the same error
    assert code_of(later) == int(E.cudaErrorIllegalAddress)
    return res


def _model_row(rig, cc: tuple[int, int], multicast: int, fabric: int):
    d = rig[0]
    got = (check("attr", d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0)),
           check("attr", d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0)))
    assert got == cc, got
    assert check("attr", d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0)) == multicast
    assert check("attr", d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0)) == fabric
    return (E.cudaSuccess,)


for _row, _preset, _cc, _mc, _fab, _src in (
        ("GM/gb300", "gb300-nvl72:1", (10, 3), 1, 1, "vllm-project/vllm#42324 (SM 10.3); GB300 NVL72 page"),
        ("GM/b300", "hgx-b300-8", (10, 3), 1, 1, "vllm-project/vllm#42324 (SM 10.3); HGX B300 page"),
        ("GM/gb10", "dgx-spark-2:1", (12, 1), 0, 0, "NVIDIA/dgx-spark-playbooks#22 (sm_121)"),
        ("GM/h200nvl", "h200-nvl-4way-8", (9, 0), 0, 0, "H200 NVL product brief (PCIe, bridges)"),
        ("GM/rtxpro6000", "rtx-pro-6000-4", (12, 0), 0, 0, "vllm-project/vllm#56128 (sm_120, PCIe)"),
        ("GM/rtx5090", "rtx5090-2", (12, 0), 0, 0, "aikitoria/open-gpu-kernel-modules#21"),
        ("GM/rtx3090", "rtx3090-2-nvlink", (8, 6), 0, 0, "noonghunna/club-3090#922")):
    case(_row, f"{_preset}: compute capability {_cc[0]}.{_cc[1]}, multicast {_mc}, fabric {_fab}",
         f"{_src}; docs/fidelity-rules.md §9", _preset, [(0, 0)], expect=E.cudaSuccess)(
        lambda rig, cc=_cc, mc=_mc, fab=_fab: _model_row(rig, cc, mc, fab))


@case("GM/p2p", "GeForce: RTX 5090 pair no P2P (stock driver); RTX 3090 pair P2P over its NV4 bridge",
      "sgl-project/sglang#4814; noonghunna/club-3090#922; docs/fidelity-rules.md §9",
      "rtx3090-2-nvlink", [(0, 0)], expect=E.cudaSuccess)
def _(rig):
    assert check("peer", rig[0].cuDeviceCanAccessPeer(0, 1)) == 1
    assert check("nvml", rig[0].nvmlDeviceGetP2PStatus(0, 1)) == NVML_P2P_STATUS_OK
    return (E.cudaSuccess,)


def _old_driver():
    c = build("hgx-h100-8")
    return c.replace_host("hgx-h100-0", driver_version="450.80.02")


@case("H2", "second open of one handle in one context on an older driver: AlreadyMapped",
      "microsoft/mscclpp#165; openucx/ucx#4599, #11216 ('resource already mapped'); row H2",
      _old_driver, [(0, 0), (0, 1)], expect=E.cudaErrorAlreadyMapped)
def _(rig):
    p, h, first = _ipc_round_trip(rig)
    q = check("cudaIpcOpenMemHandle", first)
    res = rig[1].cudaIpcOpenMemHandle(h, LAZY)
    assert rig.held(1) == {"ipc_mapping": 1}
    check("cudaIpcCloseMemHandle", rig[1].cudaIpcCloseMemHandle(q))
    check("cudaFree", rig[0].cudaFree(p))
    return res


def _pre_multicast_driver():
    c = build("hgx-h100-8")
    return c.replace_host("hgx-h100-0", driver_version="525.147.05")


@case("M9", "an NVSwitch board on a driver older than CUDA 12.1's has no multicast",
      "CUDA Toolkit release notes (12.1 GA >= 530.30.02); NCCL src/misc/cudawrap.cc "
      "(cuMulticast* at 12010); row M9", _pre_multicast_driver, [(0, 0)], expect=U("M1"))
def _(rig):
    d = rig[0]
    res = d.cuDeviceGetAttribute(DevAttr.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0)
    assert int(res[0]) == int(R.CUDA_ERROR_INVALID_VALUE), res
    return d.cuMulticastCreate(multicast_prop(2, 2 * MIB, int(FD)))


@case("H4", "cudaIpcGetMemHandle of cuMemCreate memory (expandable segments): InvalidValue",
      "vllm-project/vllm#42609 (custom_all_reduce.cuh 'invalid argument'); rows L2, H4",
      "hgx-h100-8", [(0, 0)], expect=E.cudaErrorInvalidValue)
def _(rig):
    d = rig[0]
    g = gran(d, 0, FD)
    h = create(d, g, FD)
    ptr = map_rw(d, h, g)
    res = d.cudaIpcGetMemHandle(ptr + 4096)
    unmap_free(d, ptr, g)
    check("cuMemRelease", d.cuMemRelease(h))
    return res


@case("H5", "opening the handle of memory its exporter already freed",
      "CUDA docs (a re-allocation gets a new handle, L4); row H5", "hgx-h100-8",
      [(0, 0), (0, 1)], expect=U("H5"))
def _(rig):
    p = check("cudaMalloc", rig[0].cudaMalloc(4096))
    h = check("cudaIpcGetMemHandle", rig[0].cudaIpcGetMemHandle(p))
    check("cudaFree", rig[0].cudaFree(p))
    res = rig[1].cudaIpcOpenMemHandle(h, LAZY)
    assert rig.held(1) == {}
    return res


# ---- stream capture (docs/lifecycle-rules.md CG1-CG4) ---------------------------------------
# Sim-only: the Driver protocol has no stream-capture begin/end (commsim's device path records
# captured ops, it does not capture real graphs), so a GPU run cannot reach these yet.
_GLOBAL = 0     # cudaStreamCaptureModeGlobal


@case("CG1", "cudaMalloc during a GLOBAL-mode capture",
      "CUDA runtime API cudaThreadExchangeStreamCaptureMode; PyTorch cudaMallocMaybeCapturing",
      "hgx-h100-8", [(0, 0)], expect=E.cudaErrorStreamCaptureUnsupported, sim_only=True)
def _(rig):
    d = rig[0]
    check("cudaStreamBeginCapture", d.cudaStreamBeginCapture(0, _GLOBAL))
    res = d.cudaMalloc(4096)
    d.cudaStreamEndCapture(0)
    return res


@case("CG2", "ending a capture a refused call invalidated",
      "CUDA runtime API cudaStreamEndCapture (NULL graph); cudaError_t 901", "hgx-h100-8", [(0, 0)],
      expect=E.cudaErrorStreamCaptureInvalidated, sim_only=True)
def _(rig):
    d = rig[0]
    check("cudaStreamBeginCapture", d.cudaStreamBeginCapture(0, _GLOBAL))
    d.cudaMalloc(4096)
    return d.cudaStreamEndCapture(0)


@case("CG3", "legacy IPC export during a GLOBAL-mode capture", "none: treated like cudaMalloc (CG1)",
      "hgx-h100-8", [(0, 0)], expect=U("CG3"), sim_only=True)
def _(rig):
    d = rig[0]
    p = check("cudaMalloc", d.cudaMalloc(4096))
    check("cudaStreamBeginCapture", d.cudaStreamBeginCapture(0, _GLOBAL))
    res = d.cudaIpcGetMemHandle(p)
    d.cudaStreamEndCapture(0)
    check("cudaFree", d.cudaFree(p))
    return res


@case("CG4", "ending a capture that was never begun",
      "CUDA runtime API cudaStreamEndCapture (capture must have been initiated)", "hgx-h100-8",
      [(0, 0)], expect=U("CG4"), sim_only=True)
def _(rig):
    return rig[0].cudaStreamEndCapture(0)


# ---- the runner ---------------------------------------------------------------------------

def _ids() -> list[str]:
    ids = [c.id for c in CASES]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids {dup}"
    return ids


@pytest.mark.parametrize("c", CASES, ids=_ids())
def test_rule(c: Case, rig_factory, request):
    if c.skip:
        pytest.skip(c.skip)
    if c.xfail:
        request.applymarker(pytest.mark.xfail(reason=c.xfail, strict=True))
    topo = c.topology() if callable(c.topology) else c.topology
    rig = rig_factory(topo, c.placement)
    if c.sim_only and not rig.sim:
        pytest.skip(f"{c.row}: exercises the simulator itself")
    res = c.body(rig)
    assert isinstance(res, tuple) and res, f"{c.row}: the body must return a result tuple"
    if c.expect is not None:
        want = c.expect.code() if isinstance(c.expect, U) else c.expect
        assert code_of(res) == int(want), (
            f"{c.row}: got {res[0]!r}, expected {want!r}"
            + (" (unconfirmed.UNCONFIRMED: chosen)" if c.unconfirmed else ""))
    if not c.residue:
        rig.assert_clean()


def test_every_unconfirmed_row_has_a_case():
    """unconfirmed.UNCONFIRMED is the one table of chosen codes (commsim/sim/unconfirmed.py): every entry is asserted above."""
    covered = {c.expect.row for c in CASES if c.unconfirmed}
    assert covered == set(unconfirmed.UNCONFIRMED), set(unconfirmed.UNCONFIRMED) ^ covered


def test_every_case_cites_a_source():
    for c in CASES:
        assert c.source and c.row, c


def test_every_unconfirmed_row_says_what_was_searched():
    """A row kept UNCONFIRMED names the search that failed to settle it (unconfirmed.SEARCHED)."""
    assert set(unconfirmed.SEARCHED) == set(unconfirmed.UNCONFIRMED), \
        set(unconfirmed.SEARCHED) ^ set(unconfirmed.UNCONFIRMED)
    assert all(line.strip() for line in unconfirmed.SEARCHED.values())
