"""What every GPU of the rank's host says about itself through each surface: torch.cuda's
device properties (the attributes named in argv[1], comma-separated), libcudart through ctypes
and cuda-python's runtime and driver (the device attributes named in argv[2]), cuda-python's
cudaGetDeviceProperties, and NVML. One RESULT line per rank."""

import ctypes
import json
import os
import sys

import pynvml
import torch
from cuda.bindings import driver as cu
from cuda.bindings import runtime as rt

TORCH_ATTRS = sys.argv[1].split(",")
# cudaDeviceAttr name:CUdevice_attribute name without its CU_DEVICE_ATTRIBUTE_ prefix
DEVICE_ATTRS = [a.split(":") for a in sys.argv[2].split(",")]
PROPS = sys.argv[3].split(",")                 # cudaDeviceProp fields
MISSING = "MISSING"


def ok(result):
    err, *vals = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err!r}")
    return vals[0] if len(vals) == 1 else tuple(vals)


def plain(v):
    return v.rstrip(b"\0").decode() if isinstance(v, bytes) else v


libcudart = ctypes.CDLL("libcudart.so.13")
libcudart.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
pynvml.nvmlInit()
ok(cu.cuInit(0))
devices = []
for d in range(torch.cuda.device_count()):
    props = torch.cuda.get_device_properties(d)
    seen = {"torch": {a: getattr(props, a, MISSING) for a in TORCH_ATTRS}, "cudart": {}, "rt": {},
            "cu": {}}
    for name, drv_name in DEVICE_ATTRS:
        attr = getattr(rt.cudaDeviceAttr, name)
        v = ctypes.c_int(-1)
        code = libcudart.cudaDeviceGetAttribute(ctypes.byref(v), int(attr), d)
        seen["cudart"][name] = v.value if code == 0 else f"error {code}"
        seen["rt"][name] = ok(rt.cudaDeviceGetAttribute(attr, d))
        drv = getattr(cu.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_" + drv_name)
        seen["cu"][name] = ok(cu.cuDeviceGetAttribute(drv, ok(cu.cuDeviceGet(d))))
    p = ok(rt.cudaGetDeviceProperties(d))
    seen["props"] = {f: plain(getattr(p, f, MISSING)) for f in PROPS}
    h = pynvml.nvmlDeviceGetHandleByIndex(d)
    seen["nvml"] = {"name": pynvml.nvmlDeviceGetName(h),
                    "pciDeviceId": pynvml.nvmlDeviceGetPciInfo(h).pciDeviceId,
                    "total": pynvml.nvmlDeviceGetMemoryInfo(h).total,
                    "cc": list(pynvml.nvmlDeviceGetCudaComputeCapability(h))}
    devices.append(seen)
pynvml.nvmlShutdown()
print("RESULT " + json.dumps({"rank": int(os.environ["RANK"]), "devices": devices}), flush=True)
