"""What the driver knows about a device address of one simulated process.

`cuPointerGetAttribute(s)`, `cuMemGetAddressRange` and `cudaPointerGetAttributes` ask the
driver which allocation (or mapping) an address falls in. This reads the SimDriver's address
map; nothing here changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from commsim.sim.fabric import PhysicalAlloc

if TYPE_CHECKING:
    from commsim.topology.model import GpuRef
    from commsim.sim.driver import SimDriver


@dataclass(frozen=True)
class PointerInfo:
    base: int              # start of the range the address is in (RANGE_START_ADDR)
    size: int              # its size (RANGE_SIZE)
    kind: str              # "malloc" | "ipc" | "vmm" | "mc"
    gpu: "GpuRef | None"   # the GPU whose memory backs it (None for a multicast range)
    ordinal: int           # device ordinal in this process
    legacy_ipc: bool       # CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
    handle_types: int      # CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
    buffer_id: int         # CU_POINTER_ATTRIBUTE_BUFFER_ID: unique per allocation
    mapped: bool           # CU_POINTER_ATTRIBUTE_MAPPED


def pointer_info(driver: "SimDriver", ptr: int) -> PointerInfo | None:
    """The range `ptr` lies in, or None when it is no device address of this process."""
    hit = driver._find(int(ptr))
    if hit is None:
        return None
    m, _ = hit
    target = m.target
    gpu = target.gpu if isinstance(target, PhysicalAlloc) else None
    gpus = driver.proc.gpus
    # The ordinal of the GPU the memory lives on; an imported range whose GPU this process
    # cannot see reports the device that mapped it (UNCONFIRMED: the docs say "the device
    # the pointer was allocated on" without covering hidden devices).
    ordinal = gpus.index(gpu) if gpu in gpus else driver.proc.current
    legacy = m.kind == "malloc"      # only cudaMalloc memory takes cudaIpcGetMemHandle (its CUDA docs)
    types = target.handle_types if m.kind == "vmm" and isinstance(target, PhysicalAlloc) else 0
    oid = target.aid if isinstance(target, PhysicalAlloc) else target.mid
    # A malloc range is the allocation; a VMM range is what one cuMemMap mapped
    # (UNCONFIRMED for VMM: the docs describe allocations, not mappings).
    return PointerInfo(m.base, m.size, m.kind, gpu, ordinal, legacy, types,
                       (oid << 8) | {"malloc": 1, "ipc": 2, "vmm": 3, "mc": 4}[m.kind], True)
