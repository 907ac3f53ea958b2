"""What the host, not the GPU part, decides about a GPU: where it sits on the PCI bus, where
the NVSwitches its links reach sit, and the CUDA version the host's driver supports. What a
part is (SMs, caches, clocks, product PCI id) is commsim/topology/gpu_models.py's.

PCI bus numbers are invented, deterministic per GPU index and the same on every host (real
hosts of one model share their layout): UNCONFIRMED.
"""

from __future__ import annotations

from dataclasses import dataclass

from commsim.topology.model import Cluster, GpuRef

NVIDIA_VENDOR = 0x10DE


# Bus numbers of the 8 PCIe slots of a typical 2-socket GPU server (UNCONFIRMED layout).
_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass(frozen=True)
class PciAddress:
    domain: int
    bus: int
    device: int

    @property
    def nvml_bus_id(self) -> str:
        """nvmlPciInfo_t.busId: "%08X:%02X:%02X.0" (NVML reference, nvmlPciInfo_t)."""
        return f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}.0"

    @property
    def cuda_bus_id(self) -> str:
        """cudaDeviceGetPCIBusId: "[domain]:[bus]:[device].[function]" with a 4-digit
        domain (CUDA Runtime API docs) — lower-case hex as the runtime prints it
        (UNCONFIRMED case)."""
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.0"


def pci_address(cluster: Cluster, ref: GpuRef) -> PciAddress:
    i = ref.index
    bus = _BUSES[i] if i < len(_BUSES) else 0x10 + i
    return PciAddress(0, bus, 0)


def switch_pci_address(link: int) -> PciAddress:
    """The NVSwitch at the far end of an NVLink on a switch board (UNCONFIRMED layout: one
    switch per group of links, on its own bus)."""
    return PciAddress(0, 0xC0 + link // 5, 0)


def cuda_driver_version(cluster: Cluster, host: str) -> int:
    """CUDA version the host's driver supports, as cuDriverGetVersion encodes it
    (1000*major + 10*minor). R580 drivers ship CUDA 13.0 (CUDA 13.0 release notes, driver
    580.65.06); R570 12.8; R560 12.6; R550 12.4; below, the branch each CUDA release's GA
    needs (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions":
    12.3 545, 12.2 535, 12.1 530 (the first with multicast objects, row M9), 12.0 525,
    11.8 520, 11.7 515, 11.6 510, 11.5 495, 11.4 470, 11.3 465, 11.2 460, 11.1 455, 11.0 450)."""
    major = cluster.driver_major(host)
    for branch, version in _CUDA_BY_BRANCH:
        if major >= branch:
            return version
    return _CUDA_BY_BRANCH[-1][1]


_CUDA_BY_BRANCH = ((580, 13000), (575, 12090), (570, 12080), (560, 12060), (550, 12040),
                   (545, 12030), (535, 12020), (530, 12010), (525, 12000), (520, 11080),
                   (515, 11070), (510, 11060), (495, 11050), (470, 11040), (465, 11030),
                   (460, 11020), (455, 11010), (450, 11000))


def uuid_bytes(uuid: str) -> bytes:
    """The 16 bytes of a GPU's UUID (cudaDeviceProp.uuid, CUuuid) from the text NVML prints
    (`GPU-` then 8-4-4-4-12 hex digits)."""
    return bytes.fromhex(uuid.removeprefix("GPU-").replace("-", ""))[:16].ljust(16, b"\0")
