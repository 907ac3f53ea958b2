"""Served functions of FlashInfer's `pcie_ipc_comm` JIT module that `PcieIpcAllReduceWorkspace`
calls before it allocates anything: the rank-local copy-engine eligibility and the size of
the slab each rank shares over CUDA IPC. With them served, a workspace goes on to
`create_shared_buffer` (legacy IPC) as the real package does, and stops where the machine
stops it; the ops that bind and run the workspace (`pcie_ipc_init`, `pcie_ipc_all_reduce`,
`pcie_ipc_dispose`) are declared not served. `get_pcie_ipc_comm_module` reads
`pcie_ipc_set_memop_enabled` off the module when it loads, so that name exists here and says,
when called, that the handle it needs comes from the unserved `pcie_ipc_init`.

Source followed (flashinfer-ai/flashinfer at fb28d7242b3506a2348265962041acc1fb56cca4, as
flashinfer-python 0.7.2.post1 ships it under flashinfer/data/): csrc/pcie_ipc_all_reduce.cu
(`pcie_ipc_memop_supported`, `pcie_ipc_workspace_size`, `memop_workspace_bytes`),
include/flashinfer/comm/pcie_ipc_all_reduce.cuh (`compute_workspace_layout`,
`ce_flag_slots`, kSignalPhases 8, kScratchRegionCount 2, kCeFlagStride 128, kCeMaxPieces 4)
and include/flashinfer/comm/pcie_ipc_ce_memop.cuh (`ce_binary_flag_bytes`).
"""

from __future__ import annotations

from cuda.bindings import driver as cu

from commsim.hosting.surfaces.cuda import driver_api, runtime_api

__all__ = ["pcie_ipc_memop_supported", "pcie_ipc_workspace_size", "pcie_ipc_set_memop_enabled"]

_SIGNAL_PHASES = 8
_SCRATCH_REGIONS = 2
_CE_FLAG_STRIDE = 128
_CE_MAX_PIECES = 4


def _align128(n: int) -> int:
    return (n + 127) & ~127


def _check(cond: bool, text: str) -> None:
    # TVM_FFI_ICHECK with its streamed text: a RuntimeError in Python ("Check failed" prefix
    # not reproduced, UNCONFIRMED).
    if not cond:
        raise RuntimeError(text)


def pcie_ipc_memop_supported() -> bool:
    """True only on a compute capability 12.0 device (the SM120 copy-engine protocol); any
    failing query is False."""
    err, ordinal = runtime_api.cudaGetDevice()
    if int(err) != 0:
        return False
    err, dev = driver_api.cuDeviceGet(ordinal)
    if int(err) != 0:
        return False
    attr = cu.CUdevice_attribute
    err, major = driver_api.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    err2, minor = driver_api.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    if int(err) != 0 or int(err2) != 0:
        return False
    return (int(major), int(minor)) == (12, 0)


def pcie_ipc_workspace_size(world_size: int, max_numel: int, elem_size: int,
                            max_blocks: int) -> int:
    """Bytes each rank allocates and shares: the signal slots, two double-buffered scratch
    regions, the copy-engine flags, counters and ring scratch, plus the SM120 binary flags
    where the device supports them at 4 or 8 ranks."""
    n, numel, esz, blocks = int(world_size), int(max_numel), int(elem_size), int(max_blocks)
    _check(n in (2, 4, 8), f"pcie ipc all-reduce supports world_size 2, 4 or 8, got {n}")
    _check(numel > 0, "max_numel must be positive")
    _check(esz == 2, f"only 2-byte dtypes (bfloat16, float16) are supported, got elem_size {esz}")
    _check(blocks > 0, "max_blocks must be positive")
    signal_slots = blocks + _SIGNAL_PHASES * blocks * n + blocks + 2 * _SCRATCH_REGIONS
    signal = _align128(4 * signal_slots)
    payload = _align128(numel * esz)
    scratch = _align128(2 * n * payload)
    ce_slots = 2 * (n - 1) * _CE_MAX_PIECES + 2
    ce_flags = _align128(ce_slots * _CE_FLAG_STRIDE)
    ce_counters = _align128(2 * ce_slots * 4)
    flat = 2 * (n - 1) * _align128(payload // n)
    island = 7 * _align128(payload // 4) if n == 8 else 0
    total = signal + 2 * scratch + ce_flags + ce_counters + max(flat, island)
    memop = 2 * (n - 1) * 128 if n in (4, 8) and pcie_ipc_memop_supported() else 0
    return total + memop


def pcie_ipc_set_memop_enabled(handle: int, enabled: bool) -> None:
    """Switches a bound workspace to the SM120 copy-engine protocol. Every handle comes from
    `pcie_ipc_init`, which is not served: calling this is that op's named error."""
    from commsim.hosting.surfaces.compiled.extensions import not_served_error
    raise not_served_error("flashinfer-jit", "pcie_ipc_comm", op="pcie_ipc_set_memop_enabled")
