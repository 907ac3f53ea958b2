"""Facts about a simulated GPU that a real process reads through NVML, device attributes or
torch.cuda, and that the topology model does not carry (PCI addresses, PCI device ids, SM
counts). One table, used by every hosted surface, so they agree with each other.

Sources: SM counts are the public product specifications (NVIDIA H100/H200 and Blackwell
architecture whitepapers, A100 whitepaper, Ada (L40S, RTX 4090) whitepaper, V100
whitepaper). PCI device ids are the PCI ID Repository entries (pci-ids.ucw.cz, vendor 10de)
as best recalled: UNCONFIRMED. PCI bus numbers are invented, deterministic per GPU index and
the same on every host (real hosts of one model share their layout): UNCONFIRMED.
"""

from __future__ import annotations

from dataclasses import dataclass

from commsim.topology.model import Cluster, GpuRef

NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True)
class ModelFacts:
    key: str                 # substring of the marketing name
    pci_device: int          # PCI device id (UNCONFIRMED, see module doc)
    sms: int                 # multiprocessor count (product specification)


_MODELS = (
    ModelFacts("GB200", 0x2941, 148),
    ModelFacts("GH200", 0x2342, 132),
    ModelFacts("B200", 0x2901, 148),
    ModelFacts("H200", 0x2335, 132),
    ModelFacts("H100", 0x2330, 132),
    ModelFacts("A100-SXM4", 0x20B2, 108),
    ModelFacts("A100", 0x20B5, 108),
    ModelFacts("L40S", 0x26B9, 142),
    ModelFacts("RTX 4090", 0x2684, 128),
    ModelFacts("V100", 0x1DB6, 80),
)
_UNKNOWN = ModelFacts("", 0x0000, 0)

# Bus numbers of the 8 PCIe slots of a typical 2-socket GPU server (UNCONFIRMED layout).
_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def model_facts(name: str) -> ModelFacts:
    for m in _MODELS:
        if m.key in name:
            return m
    return _UNKNOWN


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
    580.65.06); R570 12.8; R560 12.6; R550 12.4; older: 12.2 (UNCONFIRMED below R550)."""
    major = int(cluster.host(host).driver_version.split(".")[0])
    for branch, version in ((580, 13000), (575, 12090), (570, 12080), (560, 12060), (550, 12040)):
        if major >= branch:
            return version
    return 12020


def uuid_bytes(uuid: str) -> bytes:
    """The 16 bytes of a GPU's UUID (cudaDeviceProp.uuid, CUuuid) from the text NVML prints
    (`GPU-` then 8-4-4-4-12 hex digits)."""
    return bytes.fromhex(uuid.removeprefix("GPU-").replace("-", ""))[:16].ljust(16, b"\0")
