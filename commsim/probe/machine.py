"""`commsim probe`: describe the machine this process runs on, as the simulator would model it.

`probe_machine()` reads what a process can learn (CUDA device attributes,
cuDeviceCanAccessPeer, NVML fabric info / NVLink / PCIe topology, IMEX channels, host
identity) into a `MachineProbe`; `commsim.probe.scenario.scenario_text` turns that into a
scenario file (pure, tested on CPU with made-up probes). Needs a GPU: without one
`probe_machine` raises NoGpuError.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field

from commsim.driver import GpuFabricInfo

from device.errors import NoGpuError


@dataclass(frozen=True)
class GpuProbe:
    index: int                                  # CUDA ordinal
    name: str                                   # cuDeviceGetName, e.g. "NVIDIA H200"
    uuid: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    vmm: bool = True
    posix_fd: bool = True
    fabric_handle: bool = False
    multicast: bool = False
    gpu_direct_rdma: bool = False
    ipc_event: bool = True
    fabric: GpuFabricInfo | None = None         # None: NVML gave no answer (see fabric_rc)
    fabric_rc: int = 0                          # the nvmlDeviceGetGpuFabricInfo return code
    nvlinks_up: bool | None = True              # None: NVML gave no answer


@dataclass(frozen=True)
class MachineProbe:
    hostname: str
    gpus: tuple[GpuProbe, ...]
    links: tuple[tuple[str, ...], ...]          # topo -m cells; "X" on the diagonal
    p2p: tuple[tuple[bool, ...], ...]           # cuDeviceCanAccessPeer(i, j)
    imex_channels: tuple[int, ...] = ()
    arch: str = "x86_64"
    driver_version: str = ""                    # NVML, e.g. "580.82.07"
    cuda_driver_version: int = 0                # cuDriverGetVersion, e.g. 13000
    shm_namespace: str = ""
    notes: tuple[str, ...] = field(default=())  # what could not be read, and why


def probe_machine() -> MachineProbe:
    """Probe every visible GPU through a CudaDriver. Raises NoGpuError without one."""
    from cuda.bindings import driver as cu

    from device.driver import CudaDriver

    drv = CudaDriver.create(0)
    A = cu.CUdevice_attribute
    err, n = drv.cudaGetDeviceCount()
    if int(err) != 0 or not n:
        raise NoGpuError(f"cudaGetDeviceCount: {err.name}, {n} devices")
    notes: list[str] = []
    if drv.nvml.init() != 0:
        notes.append(f"NVML unavailable (nvmlInit returned {drv.nvml.init()}): links are read "
                     f"as PCIe SYS, fabric info and NVLink state are unknown")

    def attr(a, i) -> int:
        e, v = drv.cuDeviceGetAttribute(a, i)
        return int(v) if int(e) == 0 else 0

    gpus = []
    for i in range(n):
        _, name = cu.cuDeviceGetName(256, i)
        _, mem = cu.cuDeviceTotalMem(i)
        _, uuid = cu.cuDeviceGetUuid(i)
        rc, fab = drv.nvmlDeviceGetGpuFabricInfo(i)
        rc2, up = drv.nvmlDeviceGetNvLinkState(i)
        gpus.append(GpuProbe(
            index=i, name=bytes(name).split(b"\0")[0].decode(errors="replace"),
            uuid="GPU-" + bytes(uuid.bytes).hex(),
            compute_capability=(attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, i),
                                attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, i)),
            memory_bytes=int(mem),
            vmm=bool(attr(A.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, i)),
            posix_fd=bool(attr(A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, i)),
            fabric_handle=bool(attr(A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, i)),
            multicast=bool(attr(A.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, i)),
            gpu_direct_rdma=bool(attr(A.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, i)),
            ipc_event=bool(attr(A.CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, i)),
            fabric=fab if rc == 0 else None, fabric_rc=int(rc),
            nvlinks_up=bool(up) if rc2 == 0 else None))
    handles = [drv.nvml_device(i) for i in range(n)]
    links, p2p = [], []
    for i in range(n):
        row, prow = [], []
        for j in range(n):
            if i == j:
                row.append("X")
                prow.append(True)
                continue
            (ra, ha), (rb, hb) = handles[i], handles[j]
            row.append(drv.nvml.link_cell(ha, hb) if ra == 0 and rb == 0 else "SYS")
            e, ok = drv.cuDeviceCanAccessPeer(i, j)
            prow.append(bool(ok) if int(e) == 0 else False)
        links.append(tuple(row))
        p2p.append(tuple(prow))
    _, cuda_ver = cu.cuDriverGetVersion()
    return MachineProbe(
        hostname=drv.gethostname(), gpus=tuple(gpus), links=tuple(links), p2p=tuple(p2p),
        imex_channels=drv.imex_channels(), arch=platform.machine(),
        driver_version=drv.nvml.driver_version(), cuda_driver_version=int(cuda_ver),
        shm_namespace=drv.shm_namespace(), notes=tuple(notes))
