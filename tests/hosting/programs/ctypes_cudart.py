"""The libcudart the program already has loaded, opened through ctypes the way serving
stacks' wrappers do it (vLLM's CudaRTLibrary style, written for commsim's test programs):
found in /proc/self/maps, with the legacy IPC and memcpy signatures declared."""

import ctypes


class IpcHandle(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def libcudart() -> ctypes.CDLL:
    with open("/proc/self/maps") as f:
        path = next(ln.split()[-1] for ln in f if "libcudart" in ln and len(ln.split()) >= 6)
    lib = ctypes.CDLL(path)
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    lib.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(IpcHandle), ctypes.c_void_p]
    lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint]
    lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
    lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lib


def check(lib: ctypes.CDLL, err: int) -> None:
    if err:
        raise RuntimeError(f"CUDART error: {lib.cudaGetErrorString(err).decode()}")
