"""What one rank sees through the module surfaces, using only the real modules' public APIs:
cuda.bindings (runtime and driver), pynvml, torch.cuda and torch.distributed. Each rank uses
GPU LOCAL_RANK, exchanges a legacy IPC handle (and a FABRIC handle where the device says it
supports one) with every peer, and prints one RESULT line."""

import ctypes
import json
import os
import socket
import stat

import pynvml
import torch
import torch.distributed as dist
from cuda.bindings import driver as cu
from cuda.bindings import runtime as rt


def ok(result):
    """The value of a cuda-python call, which returns (error, *values); raise on an error."""
    err, *vals = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err!r}")
    return vals[0] if len(vals) == 1 else tuple(vals)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dev = int(os.environ["LOCAL_RANK"])
seen = {"rank": rank, "world": world, "hostname": socket.gethostname(), "dev": dev}

# ---- cuda.bindings.runtime ----------------------------------------------------------------
n = ok(rt.cudaGetDeviceCount())
peer = (dev + 1) % n
ok(rt.cudaSetDevice(dev))
seen["rt"] = {
    "count": n,
    "sms": ok(rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrMultiProcessorCount, dev)),
    "cc": [ok(rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, dev)),
           ok(rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, dev))],
    "can_access_peer": ok(rt.cudaDeviceCanAccessPeer(dev, peer)),
    "bus_id": ok(rt.cudaDeviceGetPCIBusId(32, dev)).rstrip(b"\0").decode(),
}
ptr = ok(rt.cudaMalloc(1 << 20))
ipc = ok(rt.cudaIpcGetMemHandle(ptr))
# cuda-python's cudaIpcMemHandle_t does not pickle: its 64 bytes travel.
handles = [None] * world
dist.all_gather_object(handles, ctypes.string_at(ipc.getPtr(), 64))
opened = {}
for r, blob in enumerate(handles):
    if r == rank:
        continue
    h = rt.cudaIpcMemHandle_t()
    ctypes.memmove(h.getPtr(), blob, 64)
    err, mapped = rt.cudaIpcOpenMemHandle(h, rt.cudaIpcMemLazyEnablePeerAccess)
    opened[r] = rt.cudaGetErrorName(err)[1].decode()
    if err == rt.cudaError_t.cudaSuccess:
        ok(rt.cudaIpcCloseMemHandle(mapped))
seen["rt"]["ipc_open"] = opened
dist.barrier()                # every peer is done with our buffer before anyone frees theirs

# ---- cuda.bindings.driver: context calls and a shareable cuMem allocation -------------------
ok(cu.cuInit(0))
cudev = ok(cu.cuDeviceGet(dev))
ctx = ok(cu.cuDevicePrimaryCtxRetain(cudev))
ok(cu.cuCtxSetCurrent(ctx))
A = cu.CUdevice_attribute
fabric_ok = bool(ok(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, cudev)))
posix_ok = bool(ok(cu.cuDeviceGetAttribute(
    A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cudev)))
seen["cu"] = {"ctx_device": int(ok(cu.cuCtxGetDevice())),
              "ctx_is_primary": int(ok(cu.cuCtxGetCurrent())) == int(ctx),
              "fabric_supported": fabric_ok, "posix_fd_supported": posix_ok}
kind = (cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC if fabric_ok else
        cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR if posix_ok else None)
if kind is not None:
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = dev
    prop.requestedHandleTypes = kind
    gran = ok(cu.cuMemGetAllocationGranularity(
        prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    err, mem = cu.cuMemCreate(gran, prop, 0)
    seen["cu"]["create"] = cu.cuGetErrorName(err)[1].decode()
    exported = None
    if err == cu.CUresult.CUDA_SUCCESS:
        exported = ok(cu.cuMemExportToShareableHandle(mem, kind, 0))
        seen["cu"]["export"] = type(exported).__name__
    if kind == cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC:
        blobs = [None] * world
        dist.all_gather_object(blobs, None if exported is None else bytes(exported.data))
        imported = []
        for r, blob in enumerate(blobs):
            if r != rank and blob is not None:
                err, h = cu.cuMemImportFromShareableHandle(blob, kind)
                imported.append(cu.cuGetErrorName(err)[1].decode())
                if err == cu.CUresult.CUDA_SUCCESS:
                    ok(cu.cuMemRelease(h))
        dist.barrier()        # an exporter releases only after every peer has imported
        seen["cu"]["fabric_imports"] = imported
    elif exported is not None:                 # a POSIX fd: a real descriptor of this process
        seen["cu"]["fd_is_real"] = stat.S_ISREG(os.fstat(exported).st_mode)
        os.close(exported)
    if exported is not None:
        ok(cu.cuMemRelease(mem))

# ---- pynvml -------------------------------------------------------------------------------
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(dev)
hp = pynvml.nvmlDeviceGetHandleByIndex(peer)
fab = pynvml.c_nvmlGpuFabricInfoV_t()
pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(fab))
try:
    link0 = pynvml.nvmlDeviceGetNvLinkState(h, 0)
except pynvml.NVMLError_NotSupported:
    link0 = "not supported"
seen["nvml"] = {
    "count": pynvml.nvmlDeviceGetCount(),
    "uuid": pynvml.nvmlDeviceGetUUID(h),
    "bus_id": pynvml.nvmlDeviceGetPciInfo(h).busId,
    "fabric": {"state": fab.state, "cluster": bytes(fab.clusterUuid).hex(), "clique": fab.cliqueId},
    "nvlink0": link0,
    "p2p": {"nvlink": pynvml.nvmlDeviceGetP2PStatus(h, hp, pynvml.NVML_P2P_CAPS_INDEX_NVLINK),
            "write": pynvml.nvmlDeviceGetP2PStatus(h, hp, pynvml.NVML_P2P_CAPS_INDEX_WRITE)},
}
pynvml.nvmlShutdown()

# ---- torch.cuda ---------------------------------------------------------------------------
free, total = torch.cuda.mem_get_info(dev)
seen["torch"] = {"available": torch.cuda.is_available(), "count": torch.cuda.device_count(),
                 "cc": list(torch.cuda.get_device_capability(dev)),
                 "can_access_peer": torch.cuda.can_device_access_peer(dev, peer),
                 "mem_used": total - free, "mem_total": total}

ok(rt.cudaFree(ptr))
ok(cu.cuDevicePrimaryCtxRelease(cudev))
everyone = [None] * world
dist.all_gather_object(everyone, [seen["hostname"], seen["nvml"]["uuid"]])
seen["everyone"] = everyone
print("RESULT " + json.dumps(seen, sort_keys=True))
dist.destroy_process_group()
