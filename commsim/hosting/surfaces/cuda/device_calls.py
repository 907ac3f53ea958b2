"""What the CUDA runtime and driver APIs answer alike, for both faces (cuda-python's
runtime_api / driver_api and the ctypes libcudart): a device attribute (cuDeviceGetAttribute
and cudaDeviceGetAttribute share cuda.h's numbering), the free and total memory of the
current device, and a copy between raw addresses (cudaMemcpy / cuMemcpy under UVA)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart

from commsim.sim.pointers import pointer_info
from commsim.hosting.state.device_props import device_props
from commsim.hosting.state.cuda_state import E, R, current

A = cu.CUdevice_attribute
K = cudart.cudaMemcpyKind


# Attributes the SimDriver does not answer but the topology does (cuda.h numbering).
def device_attribute(attrib: int, ordinal: int) -> tuple:
    """(CUresult, value) of a device attribute; an attribute commsim does not simulate fails
    loudly instead of inventing a value."""
    d = current().driver
    # Ask the SimDriver's own table unwatched: an attribute it lacks but the topology answers
    # is no CUDA error of the program's; the caller reports the final code.
    res = getattr(d, "inner", d).cuDeviceGetAttribute(attrib, ordinal)
    if int(res[0]) == 0 or int(res[0]) == int(R.CUDA_ERROR_INVALID_DEVICE):
        return res
    if not 0 <= ordinal < len(d.proc.gpus):
        return (R.CUDA_ERROR_INVALID_DEVICE, None)
    r = current()
    ref = d.proc.gpus[ordinal]
    p = device_props(r.cluster, ref)
    extra = {
        int(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT): p.multi_processor_count,
        int(A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID): p.pci.bus,
        int(A.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID): p.pci.device,
        int(A.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID): p.pci.domain,
        int(A.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE): 0,          # CU_COMPUTEMODE_DEFAULT
        int(A.CU_DEVICE_ATTRIBUTE_INTEGRATED): p.integrated,
        int(A.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY): 1,
        int(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE): p.warp_size,
        int(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK): p.max_threads_per_block,
        int(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR): p.max_threads_per_multi_processor,
        int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK): p.shared_memory_per_block,
        int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN): p.shared_memory_per_block_optin,
        int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR): p.shared_memory_per_multiprocessor,
        int(A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK): p.regs_per_block,
        int(A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR): p.regs_per_multiprocessor,
        int(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE): p.l2_cache_size,
        int(A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE): p.clock_rate_khz,
        int(A.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE): p.memory_clock_rate_khz,
        int(A.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH): p.memory_bus_width,
        int(A.CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD): 0,
    }
    if attrib in extra:
        return (R.CUDA_SUCCESS, extra[attrib])
    try:
        name = A(attrib).name
    except ValueError:
        return (R.CUDA_ERROR_INVALID_VALUE, None)            # no such attribute
    raise NotImplementedError(f"commsim hosting: device attribute {name} is not simulated")


def mem_get_info(r: Any) -> tuple:
    """(free, total) of the current device: total minus what every process holds on it."""
    d = r.driver
    g = d.device
    total = r.cluster.gpu(g).memory_bytes
    used = d.bytes_used(g)
    return (E.cudaSuccess, max(total - used, 0), total)


def memcpy(d: Any, dst: int, src: int, count: int, kind: int) -> Any:
    """cudaMemcpy over raw addresses: a host side is this process's real memory (UVA:
    cudaMemcpyDefault tells them apart by address, Runtime API docs)."""
    if count == 0:
        return E.cudaSuccess
    dst_dev = pointer_info(d, dst) is not None
    src_dev = pointer_info(d, src) is not None
    if kind == K.cudaMemcpyDefault:
        kind = (K.cudaMemcpyDeviceToDevice if dst_dev and src_dev else
                K.cudaMemcpyHostToDevice if dst_dev else
                K.cudaMemcpyDeviceToHost if src_dev else K.cudaMemcpyHostToHost)
    if kind == K.cudaMemcpyHostToHost:
        ctypes.memmove(dst, src, count)
        return E.cudaSuccess
    if kind == K.cudaMemcpyHostToDevice:
        host = np.frombuffer(ctypes.string_at(src, count), dtype=np.uint8)
        return d.memcpy_htod(dst, host)[0]
    if kind == K.cudaMemcpyDeviceToHost:
        err, data = d.memcpy_dtoh(src, count)
        if int(err) == 0:
            ctypes.memmove(dst, data.ctypes.data, count)
        return err
    if kind == K.cudaMemcpyDeviceToDevice:
        return d.cudaMemcpy(dst, src, count, K.cudaMemcpyDeviceToDevice)[0]
    return E.cudaErrorInvalidMemcpyDirection
