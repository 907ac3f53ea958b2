"""A peer's buffer as a torch tensor through a hand-made DLPack capsule, the way FlashInfer's
comm utilities wrap IPC and MNNVL mappings (written for commsim's tests): each rank fills a
cudaMalloc'd buffer, the IPC handles are all-gathered, every rank opens its right-hand
peer's, wraps the mapping as an int32 [rows, cols] view with a row stride, reads the peer's
values through it and writes a mark back for the peer to see. A capsule over an address
that is not device memory of this process is refused. One RESULT line per rank.
"""

import ctypes
import json
import os

import torch
import torch.distributed as dist
from cuda.bindings import runtime as rt

ROWS, COLS, STRIDE = 4, 8, 16            # int32 elements; rows are STRIDE apart
NBYTES = ROWS * STRIDE * 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


deleted = []
on_delete = DELETER(lambda p: deleted.append(p))
keep = []


def capsule(ptr: int, device: int):
    shape = (ctypes.c_int64 * 2)(ROWS, COLS)
    strides = (ctypes.c_int64 * 2)(STRIDE, 1)
    m = DLManagedTensor()
    m.dl_tensor = DLTensor(ptr, DLDevice(2, device), 2, DLDataType(0, 32, 1),
                           ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                           ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)), 0)
    m.deleter = on_delete
    keep.append((shape, strides, m))
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(m), b"dltensor", None)


def check(res):
    err, *rest = res
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest


def main() -> None:
    dist.init_process_group(backend="nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    check(rt.cudaSetDevice(dev))
    mine = check(rt.cudaMalloc(NBYTES))
    values = (torch.arange(ROWS * STRIDE, dtype=torch.int32) + 1000 * rank).numpy()
    check(rt.cudaMemcpy(mine, values.ctypes.data, NBYTES, rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
    handle = check(rt.cudaIpcGetMemHandle(mine))
    handles = [None] * world
    dist.all_gather_object(handles, ctypes.string_at(handle.getPtr(), 64))
    peer = (rank + 1) % world
    theirs = rt.cudaIpcMemHandle_t()
    ctypes.memmove(theirs.getPtr(), handles[peer], 64)
    mapped = check(rt.cudaIpcOpenMemHandle(theirs, rt.cudaIpcMemLazyEnablePeerAccess))
    view = torch.utils.dlpack.from_dlpack(capsule(mapped, dev))
    seen = view.cpu()
    expected = (torch.arange(ROWS * STRIDE, dtype=torch.int32) + 1000 * peer).view(ROWS, STRIDE)[:, :COLS]
    view[:, 0] = -rank - 1                     # on the peer's memory, through the mapping
    dist.barrier()
    back = torch.empty(ROWS * STRIDE, dtype=torch.int32).numpy()
    check(rt.cudaMemcpy(back.ctypes.data, mine, NBYTES, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
    writer = (rank - 1) % world
    try:
        torch.from_dlpack(capsule(0x10, dev))
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    fact = {"rank": rank, "device": str(view.device), "dtype": str(view.dtype),
            "shape": list(view.shape), "stride": list(view.stride()),
            "data_ptr": view.data_ptr() == mapped, "read": bool(torch.equal(seen, expected)),
            "marked": [int(back[r * STRIDE]) for r in range(ROWS)] == [-writer - 1] * ROWS,
            "refused": refused}
    del view
    fact["deleter_called"] = len(deleted) >= 1
    check(rt.cudaIpcCloseMemHandle(mapped))
    dist.barrier()                             # every peer closed its mapping of mine
    check(rt.cudaFree(mine))
    print("RESULT " + json.dumps(fact))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
