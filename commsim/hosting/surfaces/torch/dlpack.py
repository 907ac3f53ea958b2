"""DLPack import of device memory in a hosted rank: `torch.from_dlpack` /
`torch.utils.dlpack.from_dlpack` of a capsule whose DLTensor is on a CUDA device.

Libraries wrap raw device memory (an IPC mapping, an MNNVL or multicast range) as a tensor
by building a DLPack capsule by hand (FlashInfer 0.7's `comm/dlpack_utils.py`
`pack_strided_memory` and `comm/mnnvl.py` `create_tensor_from_cuda_memory`). The CPU build
of torch turned such a capsule into a tensor that failed at its first use with an unnamed
"not linked with support for cuda devices". Both entry points reach `torch._C._from_dlpack`
(torch/utils/dlpack.py, torch 2.13), so that is the one function replaced: in a hosted rank a
CUDA capsule gives a hosted CUDA tensor over the rank's simulated bytes at the capsule's
address (writes through either name are seen by the other, as on a GPU); anything else goes
to torch.

The capsule is read as dlpack.h lays it out (dmlc/dlpack v1.0, include/dlpack/dlpack.h):
`DLManagedTensor` (capsule name "dltensor") starts with its `DLTensor`;
`DLManagedTensorVersioned` ("dltensor_versioned") has the version, manager_ctx, deleter and
flags first. torch parses dtype, shape and strides (its own checks and errors, on a CPU twin
of the DLTensor), renames the consumed capsule "used_dltensor" and calls the producer's
deleter once the tensor is gone, as torch's fromDLPack does.

A range commsim cannot serve raises a named error: an address that is not this rank's
mapped device memory (what a kernel reading it would meet: an illegal address), or a tensor
spanning two mappings. Over a multicast address the tensor's bytes are a private buffer: a
plain load or store there is undefined (PTX ISA, multimem), only its `data_ptr()` is for
use (by a kernel commsim serves). UNCONFIRMED: whether a real multicast-backed tensor's
plain reads return zeros.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np
import torch

from commsim.sim.driver_calls import Fail
from commsim.hosting.state.session import HostedRank, hosted
from commsim.hosting.surfaces.torch import memory as torch_memory
from commsim.hosting.surfaces.torch.device import device_count
from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor

KDL_CPU, KDL_CUDA, KDL_CUDA_MANAGED = 1, 2, 13       # DLDeviceType
_CUDA_DEVICES = (KDL_CUDA, KDL_CUDA_MANAGED)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version_major", ctypes.c_uint32), ("version_minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_LAYOUTS = {b"dltensor": DLManagedTensor, b"dltensor_versioned": DLManagedTensorVersioned}

# A library object of commsim's own over the interpreter's symbols: ctypes.pythonapi is shared,
# and callers set restype/argtypes on its functions for themselves (FlashInfer 0.7.2.post1's
# comm/dlpack_utils.py sets PyCapsule_New.restype = c_void_p: through pythonapi, the capsule
# made below would come back as an int that torch refuses as "an invalid capsule").
_api = ctypes.PyDLL(None)
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_USED = {b"dltensor": b"used_dltensor", b"dltensor_versioned": b"used_dltensor_versioned"}


def _error(text: str) -> RuntimeError:
    return RuntimeError(f"commsim hosting: from_dlpack of a CUDA DLPack capsule: {text}")


def _managed(capsule: Any) -> tuple[bytes, Any] | None:
    """(capsule name, the managed tensor struct) of a DLPack capsule, else None."""
    if type(capsule).__name__ != "PyCapsule":
        return None
    name = _api.PyCapsule_GetName(capsule)
    layout = _LAYOUTS.get(name)
    if layout is None:
        return None
    return name, layout.from_address(_api.PyCapsule_GetPointer(capsule, name))


def _span_bytes(dl: DLTensor, itemsize: int) -> int:
    """Bytes from the first element to the end of the last (dlpack.h: NULL strides mean
    compact row-major)."""
    shape = [dl.shape[i] for i in range(dl.ndim)]
    if any(s == 0 for s in shape):
        return 0
    if not dl.strides:
        n = 1
        for s in shape:
            n *= s
        return n * itemsize
    strides = [dl.strides[i] for i in range(dl.ndim)]
    if any(st < 0 for st in strides):
        raise _error("negative strides are not simulated")
    return (1 + sum((s - 1) * st for s, st in zip(shape, strides))) * itemsize


def _parsed(real: Any, dl: DLTensor, host: int) -> tuple[Any, tuple, tuple]:
    """torch's reading of the DLTensor (dtype, shape, strides, and its errors), from a CPU twin
    over `host` that nothing reads. The twin outlives torch's tensor over it (torch keeps the
    struct's address until that tensor is freed)."""
    twin = DLManagedTensor()
    ctypes.memmove(ctypes.addressof(twin.dl_tensor), ctypes.addressof(dl), ctypes.sizeof(DLTensor))
    twin.dl_tensor.data = host
    twin.dl_tensor.byte_offset = 0
    twin.dl_tensor.device = DLDevice(KDL_CPU, 0)
    twin.deleter = None
    t = real(_api.PyCapsule_New(ctypes.addressof(twin), b"dltensor", None))
    facts = (t.dtype, tuple(t.shape), tuple(t.stride()))
    del t
    return facts


def _bytes_at(r: HostedRank, ptr: int, nbytes: int) -> np.ndarray:
    try:
        m, _ = r.driver.resolve(ptr, nbytes)
    except Fail as e:
        raise _error(f"{nbytes} byte(s) at {ptr:#x} are not device memory this process has "
                     f"mapped in one range (a kernel reading them would meet CUDA error "
                     f"{int(e.code)}: an illegal address)") from None
    if m.kind == "mc":
        return np.zeros(nbytes, dtype=np.uint8)
    return r.driver.view(ptr, nbytes)


def _release(deleter: int, managed: int) -> None:
    _DELETER(deleter)(managed)


def hosted_tensor(r: HostedRank, real: Any, capsule: Any, name: bytes, managed: Any) -> Any:
    """A hosted CUDA tensor over the bytes a CUDA DLPack capsule names."""
    dl = managed.dl_tensor
    device = dl.device.device_id
    if not 0 <= device < device_count():
        raise _error(f"device_id {device} is not a CUDA device of this process "
                     f"({device_count()} visible)")
    itemsize = max(1, (dl.dtype.bits * dl.dtype.lanes + 7) // 8)
    nbytes = _span_bytes(dl, itemsize)
    ptr = int(dl.data or 0) + int(dl.byte_offset)
    view = _bytes_at(r, ptr, nbytes) if nbytes else np.zeros(0, dtype=np.uint8)
    dtype, shape, stride = _parsed(real, dl, int(view.ctypes.data))
    inner = torch.from_numpy(view).view(dtype).as_strided(shape, stride)
    if _api.PyCapsule_SetName(capsule, _USED[name]) != 0:
        raise _error("the capsule could not be marked consumed")
    if managed.deleter:
        weakref.finalize(view, _release, managed.deleter, ctypes.addressof(managed))
    block = torch_memory.DeviceBlock(ptr, nbytes, device, int(view.ctypes.data),
                                     torch_memory.device_clock(r, device))
    return HostedCudaTensor(inner, device, block)


def from_dlpack_of(real: Any) -> Any:
    """The replacement of `torch._C._from_dlpack` around torch's own `real`."""
    def _from_dlpack(capsule: Any) -> Any:
        r = hosted()
        found = _managed(capsule) if r is not None else None
        if found is None or found[1].dl_tensor.device.device_type not in _CUDA_DEVICES:
            return real(capsule)
        return hosted_tensor(r, real, capsule, *found)
    _from_dlpack.__name__ = _from_dlpack.__qualname__ = "_from_dlpack"
    _from_dlpack.__commsim_dlpack__ = True            # type: ignore[attr-defined]
    return _from_dlpack
