"""CUDA tensors between processes as torch.multiprocessing sends them: legacy CUDA IPC.

`torch.multiprocessing.reductions.reduce_tensor(t)` of a CUDA tensor (what a
`torch.multiprocessing` queue pickles, and what RLHF weight sync in vLLM and SGLang calls
directly to hand a trainer's weights to an inference engine) gives
`(rebuild_cuda_tensor, args)`. `args` carry the `cudaIpcGetMemHandle` of the caching
allocator's segment holding the storage, the storage's byte offset in the segment and its
size (torch/csrc/StorageSharing.cpp, THPStorage_shareCuda: the handle of
`getBaseAllocation`, "offset_bytes" from it), the device, dtype, sizes, strides, and
requires_grad. The receiver calls `rebuild_cuda_tensor(*args)` (often with `args[6]`, the
device, replaced by its own), which opens the handle with `cudaIpcOpenMemHandle(...,
cudaIpcMemLazyEnablePeerAccess)` once per handle and process (torch/csrc/CudaIPCTypes.cpp
caches the opened pointer by handle) and builds a tensor over the mapping.

In a hosted rank both ends go through the rank's simulated driver, so every rule of legacy
IPC applies (docs/fidelity-rules.md): a handle from another host of a GB200 NVLink domain fails the
open with `invalid resource handle` (row L8), raised as torch raises a failed C10_CUDA_CHECK.
The receiver's tensor is a hosted CUDA tensor over the mapped bytes: writes on either side
are seen by the other. The mapping is closed (`cudaIpcCloseMemHandle`) when the receiver's
last tensor over it is collected.

Not modelled (UNCONFIRMED whether any program depends on them): torch's producer-side
reference counter file and its deferred free (the producer must keep the tensor alive while
a consumer uses it, torch's documented rule: docs "Multiprocessing best practices", "CUDA in
multiprocessing"); the IPC event (work completes at the call here, so there is nothing to
wait for): `ref_counter_handle` and `event_handle` travel as empty bytes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from commsim.driver import LAZY_ENABLE_PEER_ACCESS
from commsim.hosting.state.cuda_state import rank_state
from commsim.hosting.install.patches import Patches
from commsim.hosting.state.session import current, hosted
from commsim.hosting.install.registry import register_surface
from commsim.hosting.surfaces.torch import memory as torch_memory
from commsim.hosting.surfaces.torch.device import check_cuda, cuda_index
from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor, new_empty

KEY = "torch.ipc"
_RANGE_START_ADDR = 11        # CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
_real: dict[str, Any] = {}


@dataclass
class _Opened:
    """Per rank: handle -> [mapped base, tensors' storages over it] (CudaIPCTypes' cache)."""

    maps: dict[bytes, list[int]] = field(default_factory=dict)
    hooked: bool = False
    # Set at the process's exit: a tensor collected after it has nothing to close (the exit
    # unmapped everything; a call then would be a CUDA error of a process that is gone).
    exited: bool = False

    def exit(self) -> None:
        self.exited = True


def reduce_tensor(tensor: Any) -> Any:
    """torch.multiprocessing.reductions.reduce_tensor: a hosted CUDA tensor by IPC handle."""
    if not isinstance(tensor, HostedCudaTensor) or hosted() is None:
        return _real["reduce_tensor"](tensor)
    block, inner = tensor._block, tensor._inner
    device = tensor.device.index
    if block is None:               # an empty storage has no allocation (a null pointer)
        handle, size, offset = None, 0, 0
    else:
        r = current()
        storage_ptr = block.device_address(inner.untyped_storage().data_ptr())
        base = int(check_cuda(r.driver.cuPointerGetAttribute(_RANGE_START_ADDR, storage_ptr)))
        handle = bytes(check_cuda(r.driver.cudaIpcGetMemHandle(base)))
        size, offset = inner.untyped_storage().nbytes(), storage_ptr - base
    rebuild = _real["module"].rebuild_cuda_tensor
    cls = torch.nn.Parameter if isinstance(tensor, torch.nn.Parameter) else torch.Tensor
    return (rebuild, (cls, tensor.size(), tensor.stride(), inner.storage_offset(),
                      torch.storage.TypedStorage, tensor.dtype, device, handle, size, offset,
                      tensor.requires_grad, b"", 0, b"", False))


def rebuild_cuda_tensor(tensor_cls: Any, tensor_size: Any, tensor_stride: Any, tensor_offset: int,
                        storage_cls: Any, dtype: Any, storage_device: int, storage_handle: Any,
                        storage_size_bytes: int, storage_offset_bytes: int, requires_grad: bool,
                        ref_counter_handle: Any, ref_counter_offset: Any, event_handle: Any,
                        event_sync_required: Any) -> Any:
    """torch.multiprocessing.reductions.rebuild_cuda_tensor in a hosted rank."""
    if hosted() is None:
        return _real["rebuild_cuda_tensor"](
            tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype,
            storage_device, storage_handle, storage_size_bytes, storage_offset_bytes,
            requires_grad, ref_counter_handle, ref_counter_offset, event_handle,
            event_sync_required)
    device = cuda_index(storage_device)
    if storage_handle is None or storage_size_bytes == 0:
        t = new_empty(tuple(tensor_size), tuple(tensor_stride), dtype, device)
    else:
        inner, block = _open(current(), bytes(storage_handle), device, storage_offset_bytes,
                             storage_size_bytes)
        t = HostedCudaTensor(inner.view(dtype).as_strided(tuple(tensor_size), tuple(tensor_stride),
                                                          tensor_offset), device, block)
    if requires_grad:
        t.requires_grad_(True)
    if tensor_cls is torch.nn.Parameter:
        t._is_param = True
    return t


def _open(r: Any, handle: bytes, device: int, offset: int, nbytes: int) -> tuple[Any, Any]:
    """A uint8 CPU tensor over `nbytes` at `offset` of the allocation `handle` names, mapped
    in this rank once per handle (torch's CudaIPCTypes), and its DeviceBlock."""
    opened = rank_state(r, KEY, _Opened)
    if not opened.hooked:
        opened.hooked = True
        torch_memory.before_exit(r, opened.exit)
    entry = opened.maps.get(handle)
    if entry is None:
        def open_() -> int:
            return int(check_cuda(r.driver.cudaIpcOpenMemHandle(handle, int(LAZY_ENABLE_PEER_ACCESS))))
        entry = opened.maps[handle] = [torch_memory._with_device(r, device, open_), 0]
    base = entry[0]
    view = r.driver.view(base + offset, nbytes)
    entry[1] += 1
    weakref.finalize(view, _release, r, opened, handle, device)
    block = torch_memory.DeviceBlock(base + offset, nbytes, device, int(view.ctypes.data),
                                     torch_memory.device_clock(r, device))
    return torch.from_numpy(view), block


def _release(r: Any, opened: _Opened, handle: bytes, device: int) -> None:
    """The last tensor over a mapping is gone: cudaIpcCloseMemHandle, as torch's deleter."""
    entry = opened.maps.get(handle)
    if entry is None or opened.exited:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del opened.maps[handle]
    torch_memory._with_device(r, device, lambda: r.driver.cudaIpcCloseMemHandle(entry[0]))


def _patch(patches: Patches, reductions: Any) -> None:
    _real.update(module=reductions, reduce_tensor=reductions.reduce_tensor,
                 rebuild_cuda_tensor=reductions.rebuild_cuda_tensor)
    for fn, name in ((reduce_tensor, "reduce_tensor"), (rebuild_cuda_tensor, "rebuild_cuda_tensor")):
        # Pickled by reference: the receiver looks the name up in torch's module.
        fn.__module__, fn.__qualname__ = reductions.__name__, name
        patches.attr(reductions, name, fn)
    # torch.multiprocessing's pickler finds reducers by exact type (its dispatch table).
    ForkingPickler.register(HostedCudaTensor, reduce_tensor)


def _install(patches: Patches) -> None:
    patches.on_import("torch.multiprocessing.reductions", lambda m: _patch(patches, m))


SURFACE = register_surface("torch CUDA IPC (torch.multiprocessing)", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
