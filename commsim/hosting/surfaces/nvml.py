"""`pynvml` (nvidia-ml-py) for a hosted rank: a simulated libnvidia-ml.so.1.

nvidia-ml-py is pure Python over ctypes: `nvmlInit()` loads `CDLL("libnvidia-ml.so.1")` and
every call goes through a C function. commsim serves that library (fakelib.py), so the real
pynvml module runs unchanged: its structs, constants, `NVMLError` subclasses with their real
codes (`NVMLError_Uninitialized`, `NVMLError_NotSupported`, ...), its argument handling.

Like real NVML, the library sees every GPU of the rank's host whatever CUDA_VISIBLE_DEVICES
says: that variable is read by the CUDA driver, not by NVML, so NVML indices are the host's,
not CUDA ordinals (widely observed, e.g. nvidia-smi lists all GPUs under any
CUDA_VISIBLE_DEVICES; no NVML doc sentence found: UNCONFIRMED as documented behaviour). Facts come from the rank's driver (fabric info, NVLink P2P status: the SimDriver's
NVML calls) and from the host's topology that a real process reads through NVML (names,
UUIDs, link matrix); PCI addresses from host_layout (UNCONFIRMED values, consistent across
surfaces).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import pynvml as N

from commsim.topology.model import GpuRef
from commsim.hosting.state import host_layout
from commsim.topology.gpu_models import part_of
from commsim.hosting.install import fakelib
from commsim.hosting.install.dispatch import not_simulated
from commsim.hosting.state.cuda_state import rank_state
from commsim.hosting.state.session import current
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import hosted

SONAME = "libnvidia-ml.so"
_handles: dict[tuple[str, int], Any] = {}    # (host, index) -> buffer whose address is the handle
_by_addr: dict[int, tuple[str, int]] = {}


class _Fail(Exception):
    def __init__(self, code: int):
        self.code = code


def _handle_addr(host: str, index: int) -> int:
    key = (host, index)
    buf = _handles.get(key)
    if buf is None:
        buf = _handles[key] = ctypes.create_string_buffer(16)
        _by_addr[ctypes.addressof(buf)] = key
    return ctypes.addressof(buf)


def _inits(r: Any) -> list[int]:
    """How many nvmlInit calls of this rank are not yet shut down (a one-slot list)."""
    return rank_state(r, "nvml", lambda: [0])


def _rank_host():
    r = current()
    if _inits(r)[0] <= 0:
        raise _Fail(N.NVML_ERROR_UNINITIALIZED)
    return r, r.cluster.host(r.host)


def _enumerated(r: Any, host: Any) -> tuple[int, ...]:
    """The host indices of the GPUs NVML enumerates in this process, NVML index i ->
    result[i]: the host's, or its container's device cgroup (row W3, sim/visibility.py)."""
    return tuple(range(len(host.gpus))) if r.container is None else tuple(r.container)


def _gpu(handle: int):
    """(rank, host, host index) of a device handle this process's NVML can reach."""
    r, host = _rank_host()
    key = _by_addr.get(handle)
    if key is None or key[0] != host.name or key[1] not in _enumerated(r, host):
        raise _Fail(N.NVML_ERROR_INVALID_ARGUMENT)
    return r, host, key[1]


def _write_str(addr: int, length: int, text: str) -> None:
    data = text.encode()
    if length <= len(data):
        raise _Fail(N.NVML_ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(addr, data + b"\0", len(data) + 1)


def _put(addr: int, ctype: Any, value: int) -> None:
    if not addr:
        raise _Fail(N.NVML_ERROR_INVALID_ARGUMENT)
    ctype.from_address(addr).value = value


def _pci_fill(info: Any, pci: host_layout.PciAddress, device_id: int) -> None:
    info.busIdLegacy = f"{pci.domain:04X}:{pci.bus:02X}:{pci.device:02X}.0".encode()
    info.busId = pci.nvml_bus_id.encode()
    info.domain, info.bus, info.device = pci.domain, pci.bus, pci.device
    info.pciDeviceId = (device_id << 16) | host_layout.NVIDIA_VENDOR
    info.pciSubSystemId = 0


def _product_id(model: str) -> int:
    """The GPU part's PCI product id (commsim/topology/gpu_models.py, which cites its source)."""
    return part_of(model).pci_device_id(model)


# ---- NVLink model ---------------------------------------------------------------------------

def _links(r: Any, host: Any, index: int) -> list[tuple[str, Any]]:
    """The NVLinks of one GPU, in link order: ("switch", link) or ("gpu", peer index).
    On an NVSwitch board every link goes to a switch and `topo -m` shows the per-GPU count
    (NV18 on HGX H100 / GB200 trays: 18 links, NVIDIA HGX H100 and GB200 NVL72 data sheets); without switches a GPU's
    links go to its peers, NV<k> meaning k links (DGX-1 cube mesh, NVLink bridges)."""
    ref = GpuRef(host.name, index)
    counts = {j: host.link(index, j).nvlinks for j in range(len(host.gpus))
              if j != index and host.link(index, j).is_nvlink}
    if r.cluster.domain_of(ref) is not None:
        n = max(counts.values(), default=18)
        return [("switch", k) for k in range(n)]
    out: list[tuple[str, Any]] = []
    for j in sorted(counts):
        out += [("gpu", j)] * counts[j]
    return out


def _link(handle: int, link: int):
    r, host, index = _gpu(handle)
    links = _links(r, host, index)
    if not links:
        raise _Fail(N.NVML_ERROR_NOT_SUPPORTED)      # a GPU without NVLink
    if not 0 <= link < len(links):
        # Indices past the GPU's link count: NVML_ERROR_INVALID_ARGUMENT (FlashInfer
        # mnnvl.py support_nvlink: "Link indices beyond the device's link count raise
        # InvalidArgument on some platforms (e.g. B200)").
        raise _Fail(N.NVML_ERROR_INVALID_ARGUMENT)
    return r, host, index, links[link]


# ---- the C functions --------------------------------------------------------------------------

def _functions() -> dict[str, Callable[..., int]]:
    U, I = ctypes.c_uint, ctypes.c_int

    def init(*_flags: int) -> int:
        _inits(current())[0] += 1
        return 0

    def shutdown() -> int:
        n = _inits(current())
        if n[0] <= 0:
            raise _Fail(N.NVML_ERROR_UNINITIALIZED)
        n[0] -= 1
        return 0

    def error_string(code: int) -> bytes:
        # pynvml's own table of the library's texts (nvidia-ml-py NVMLError); the C
        # library's strings for other codes are UNCONFIRMED.
        return N.NVMLError._errcode_to_string.get(ctypes.c_int(code).value, "Unknown Error").encode()

    def driver_version(buf: int, length: int) -> int:
        r, host = _rank_host()
        _write_str(buf, length, r.cluster.driver_version(host.name))
        return 0

    def cuda_driver_version(out: int) -> int:
        r = current()    # needs no nvmlInit (NVML reference: "can be called before nvmlInit")
        _put(out, I, host_layout.cuda_driver_version(r.cluster, r.host))
        return 0

    def count(out: int) -> int:
        r, host = _rank_host()
        _put(out, U, len(_enumerated(r, host)))
        return 0

    def by_index(index: int, out: int) -> int:
        r, host = _rank_host()
        seen = _enumerated(r, host)
        if not 0 <= index < len(seen):
            raise _Fail(N.NVML_ERROR_INVALID_ARGUMENT)
        _put(out, ctypes.c_void_p, _handle_addr(host.name, seen[index]))
        return 0

    def by_uuid(text: int, out: int) -> int:
        r, host = _rank_host()
        want = ctypes.string_at(text).decode(errors="replace") if text else ""
        for g in (host.gpus[i] for i in _enumerated(r, host)):
            if g.uuid == want:
                _put(out, ctypes.c_void_p, _handle_addr(host.name, g.index))
                return 0
        raise _Fail(N.NVML_ERROR_NOT_FOUND)

    def by_pci(text: int, out: int) -> int:
        r, host = _rank_host()
        want = ctypes.string_at(text).decode(errors="replace").upper() if text else ""
        for g in (host.gpus[i] for i in _enumerated(r, host)):
            pci = host_layout.pci_address(r.cluster, GpuRef(host.name, g.index))
            if want in (pci.nvml_bus_id, pci.nvml_bus_id[4:]):
                _put(out, ctypes.c_void_p, _handle_addr(host.name, g.index))
                return 0
        raise _Fail(N.NVML_ERROR_NOT_FOUND)

    def index_of(h: int, out: int) -> int:
        r, host, i = _gpu(h)
        _put(out, U, _enumerated(r, host).index(i))
        return 0

    def minor_number(h: int, out: int) -> int:
        _, _, i = _gpu(h)
        _put(out, U, i)          # /dev/nvidia<i>: the node keeps its host number in a container
        return 0

    def name(h: int, buf: int, length: int) -> int:
        _, host, i = _gpu(h)
        _write_str(buf, length, host.gpus[i].model)
        return 0

    def uuid(h: int, buf: int, length: int) -> int:
        _, host, i = _gpu(h)
        _write_str(buf, length, host.gpus[i].uuid)
        return 0

    def pci_info(h: int, out: int) -> int:
        r, host, i = _gpu(h)
        info = N.nvmlPciInfo_t.from_address(out)
        _pci_fill(info, host_layout.pci_address(r.cluster, GpuRef(host.name, i)),
                  _product_id(host.gpus[i].model))
        return 0

    def compute_capability(h: int, major: int, minor: int) -> int:
        _, host, i = _gpu(h)
        _put(major, I, host.gpus[i].compute_capability[0])
        _put(minor, I, host.gpus[i].compute_capability[1])
        return 0

    def _memory(r: Any, host: Any, i: int) -> tuple[int, int]:
        g = GpuRef(host.name, i)
        total = host.gpus[i].memory_bytes
        return total, min(r.driver.bytes_used(g), total)

    def memory(h: int, out: int) -> int:
        r, host, i = _gpu(h)
        total, used = _memory(r, host, i)
        m = N.c_nvmlMemory_t.from_address(out)
        m.total, m.used, m.free = total, used, total - used
        return 0

    def memory_v2(h: int, out: int) -> int:
        r, host, i = _gpu(h)
        m = N.c_nvmlMemory_v2_t.from_address(out)
        if m.version != N.nvmlMemory_v2:
            raise _Fail(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        total, used = _memory(r, host, i)
        m.total, m.reserved, m.used, m.free = total, 0, used, total - used
        return 0

    def _fabric(r: Any, i: int) -> Any:
        code, info = r.driver.nvmlDeviceGetGpuFabricInfo(i)
        if code:
            raise _Fail(code)
        return info

    def fabric_info(h: int, out: int) -> int:
        r, _, i = _gpu(h)
        f = _fabric(r, i)
        s = N.c_nvmlGpuFabricInfo_t.from_address(out)
        ctypes.memmove(ctypes.addressof(s.clusterUuid), f.cluster_uuid, 16)
        s.status, s.cliqueId, s.state = f.status, f.clique_id, f.state
        return 0

    def fabric_info_v(h: int, out: int) -> int:
        r, _, i = _gpu(h)
        if not out:
            raise _Fail(N.NVML_ERROR_INVALID_ARGUMENT)
        version = ctypes.c_uint.from_address(out).value
        cls = {N.nvmlGpuFabricInfo_v2: N.c_nvmlGpuFabricInfo_v2_t,
               N.nvmlGpuFabricInfo_v3: N.c_nvmlGpuFabricInfo_v3_t}.get(version)
        if cls is None:
            raise _Fail(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)   # versioned struct (nvml.h)
        f = _fabric(r, i)
        s = cls.from_address(out)
        ctypes.memmove(ctypes.addressof(s.clusterUuid), f.cluster_uuid, 16)
        s.status, s.cliqueId, s.state = f.status, f.clique_id, f.state
        s.healthMask = 0          # health bits not simulated: "not supported" (UNCONFIRMED)
        if cls is N.c_nvmlGpuFabricInfo_v3_t:
            s.healthSummary = N.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
        return 0

    def nvlink_state(h: int, link: int, out: int) -> int:
        r, host, i, _ = _link(h, link)
        # A GPU whose links are not all up (fault `nvlinks_up = false`) reports link 0
        # inactive (which link is down is UNCONFIRMED: the model says only "not all").
        _put(out, U, 0 if (link == 0 and not host.gpus[i].nvlinks_up) else 1)
        return 0

    def nvlink_capability(h: int, link: int, cap: int, out: int) -> int:
        r, host, i, (kind, peer) = _link(h, link)
        p2p = kind == "switch" or host.link(i, peer).p2p
        caps = {N.NVML_NVLINK_CAP_P2P_SUPPORTED: p2p, N.NVML_NVLINK_CAP_P2P_ATOMICS: p2p,
                N.NVML_NVLINK_CAP_VALID: True,
                # NVLink to system memory (POWER NPUs) and SLI bridges do not exist on
                # these machines (UNCONFIRMED for Grace C2C, which NVML counts separately).
                N.NVML_NVLINK_CAP_SYSMEM_ACCESS: False, N.NVML_NVLINK_CAP_SYSMEM_ATOMICS: False,
                N.NVML_NVLINK_CAP_SLI_BRIDGE: False}
        if cap not in caps:
            raise _Fail(N.NVML_ERROR_INVALID_ARGUMENT)
        _put(out, U, int(caps[cap]))
        return 0

    def nvlink_remote_pci(h: int, link: int, out: int) -> int:
        r, host, i, (kind, peer) = _link(h, link)
        info = N.nvmlPciInfo_t.from_address(out)
        if kind == "switch":
            _pci_fill(info, host_layout.switch_pci_address(peer), 0)
        else:
            _pci_fill(info, host_layout.pci_address(r.cluster, GpuRef(host.name, peer)),
                      _product_id(host.gpus[peer].model))
        return 0

    def nvlink_remote_type(h: int, link: int, out: int) -> int:
        _, _, _, (kind, _peer) = _link(h, link)
        _put(out, I, N.NVML_NVLINK_DEVICE_TYPE_SWITCH if kind == "switch" else N.NVML_NVLINK_DEVICE_TYPE_GPU)
        return 0

    def p2p_status(h1: int, h2: int, index: int, out: int) -> int:
        r, host, i = _gpu(h1)
        _, _, j = _gpu(h2)
        if index == N.NVML_P2P_CAPS_INDEX_NVLINK:
            code, status = r.driver.nvmlDeviceGetP2PStatus(i, j)      # the driver's answer
            if code:
                raise _Fail(code)
        elif index in (N.NVML_P2P_CAPS_INDEX_READ, N.NVML_P2P_CAPS_INDEX_WRITE,
                       N.NVML_P2P_CAPS_INDEX_ATOMICS, N.NVML_P2P_CAPS_INDEX_PCI):
            lk = None if i == j else host.link(i, j)
            ok = lk is None or lk.p2p
            if index == N.NVML_P2P_CAPS_INDEX_ATOMICS:
                ok = lk is None or (lk.p2p and lk.is_nvlink)   # PCIe atomics: UNCONFIRMED, off
            status = N.NVML_P2P_STATUS_OK if ok else N.NVML_P2P_STATUS_NOT_SUPPORTED
        else:
            raise _Fail(N.NVML_ERROR_INVALID_ARGUMENT)
        _put(out, I, status)
        return 0

    def common_ancestor(h1: int, h2: int, out: int) -> int:
        _, host, i = _gpu(h1)
        _, _, j = _gpu(h2)
        levels = {"PIX": N.NVML_TOPOLOGY_SINGLE, "PXB": N.NVML_TOPOLOGY_MULTIPLE,
                  "PHB": N.NVML_TOPOLOGY_HOSTBRIDGE, "NODE": N.NVML_TOPOLOGY_NODE,
                  "SYS": N.NVML_TOPOLOGY_SYSTEM}
        if i == j:
            level = N.NVML_TOPOLOGY_INTERNAL
        else:
            lk = host.link(i, j)
            if lk.is_nvlink:
                # The PCIe path under an NVLink pair is not in the model: GPUs of one half
                # of the host share a CPU socket (UNCONFIRMED; seeds/000 shows GB200 trays
                # with GPUs 0-1 on NUMA node 0 and 2-3 on node 1).
                half = max(len(host.gpus) // 2, 1)
                level = N.NVML_TOPOLOGY_NODE if i // half == j // half else N.NVML_TOPOLOGY_SYSTEM
            else:
                level = levels[lk.kind]
        _put(out, I, level)
        return 0

    fns = {
        "nvmlInit": init, "nvmlInit_v2": init, "nvmlInitWithFlags": init,
        "nvmlShutdown": shutdown, "nvmlErrorString": error_string,
        "nvmlSystemGetDriverVersion": driver_version,
        "nvmlSystemGetCudaDriverVersion": cuda_driver_version,
        "nvmlSystemGetCudaDriverVersion_v2": cuda_driver_version,
        "nvmlDeviceGetCount": count, "nvmlDeviceGetCount_v2": count,
        "nvmlDeviceGetHandleByIndex": by_index, "nvmlDeviceGetHandleByIndex_v2": by_index,
        "nvmlDeviceGetHandleByUUID": by_uuid,
        "nvmlDeviceGetHandleByPciBusId": by_pci, "nvmlDeviceGetHandleByPciBusId_v2": by_pci,
        "nvmlDeviceGetIndex": index_of, "nvmlDeviceGetMinorNumber": minor_number,
        "nvmlDeviceGetName": name, "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetPciInfo_v3": pci_info, "nvmlDeviceGetPciInfo_v2": pci_info,
        "nvmlDeviceGetCudaComputeCapability": compute_capability,
        "nvmlDeviceGetMemoryInfo": memory, "nvmlDeviceGetMemoryInfo_v2": memory_v2,
        "nvmlDeviceGetGpuFabricInfo": fabric_info, "nvmlDeviceGetGpuFabricInfoV": fabric_info_v,
        "nvmlDeviceGetNvLinkState": nvlink_state,
        "nvmlDeviceGetNvLinkCapability": nvlink_capability,
        "nvmlDeviceGetNvLinkRemotePciInfo_v2": nvlink_remote_pci,
        "nvmlDeviceGetNvLinkRemoteDeviceType": nvlink_remote_type,
        "nvmlDeviceGetP2PStatus": p2p_status,
        "nvmlDeviceGetTopologyCommonAncestor": common_ancestor,
    }
    return {k: _returning_code(v) for k, v in fns.items()}


def _returning_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except _Fail as f:
            return int(f.code)
    call.__name__ = fn.__name__
    return call


_FUNCTIONS = _functions()
SIMULATED = tuple(sorted(_FUNCTIONS))


def library(name: str) -> fakelib.FakeLibrary:
    # Every nvml* symbol exists in the real library; the ones not simulated fail loudly.
    return fakelib.FakeLibrary(name, _FUNCTIONS, lambda s: s.startswith("nvml"),
                               lambda s: not_simulated(f"libnvidia-ml.{s}"))


def _patch(patches: Patches) -> None:
    fakelib.serve(patches, SONAME, library, hosted)
    # pynvml keeps the library it loaded and the functions it looked up: drop them so the
    # next nvmlInit loads the served (or, after uninstall, the real) library.
    patches.attr(N, "nvmlLib", None)
    N._nvmlGetFunctionPointer_cache.clear()
    patches.on_restore(N._nvmlGetFunctionPointer_cache.clear)


SURFACE = register_surface("pynvml", _patch)
install, uninstall = SURFACE.install, SURFACE.uninstall
