"""libcudart through ctypes, the way serving stacks' `CudaRTLibrary` wrappers load it.

`RTWrapper` below is written in that style (our own code): it finds the library in
/proc/self/maps, opens it with ctypes.CDLL, declares restype/argtypes, passes byref()
out-parameters and a 128-byte handle struct, and raises `RuntimeError(f"CUDART error: ...")`.
"""

from __future__ import annotations

import ctypes
import os
import stat

import pytest
import torch

from commsim.hosting.surfaces.cuda import cudart
from commsim.hosting.install import fakelib
from sim_ranks import module_surfaces, ranks, run, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")


class IpcHandle(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]     # as the wrappers declare it (cuda_runtime_api.h)


def loaded_library_paths(stem: str) -> list[str]:
    """The mapped files whose line names `stem`, in /proc/self/maps' order."""
    with open("/proc/self/maps") as maps:
        found = [line[line.index("/"):].strip() for line in maps if stem in line]
    return list(dict.fromkeys(found))


def loaded_library_path(stem: str) -> str | None:
    """The first, as vLLM's and FlashInfer's find_loaded_library take it."""
    return next(iter(loaded_library_paths(stem)), None)


class RTWrapper:
    SIGNATURES = {
        "cudaGetErrorString": (ctypes.c_char_p, [ctypes.c_int]),
        "cudaSetDevice": (ctypes.c_int, [ctypes.c_int]),
        "cudaGetDevice": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]),
        "cudaDeviceSynchronize": (ctypes.c_int, []),
        "cudaDeviceCanAccessPeer": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]),
        "cudaMalloc": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
        "cudaFree": (ctypes.c_int, [ctypes.c_void_p]),
        "cudaMemset": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]),
        "cudaMemcpy": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
        "cudaIpcGetMemHandle": (ctypes.c_int, [ctypes.POINTER(IpcHandle), ctypes.c_void_p]),
        "cudaIpcOpenMemHandle": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint]),
        "cudaIpcCloseMemHandle": (ctypes.c_int, [ctypes.c_void_p]),
    }

    def __init__(self):
        path = loaded_library_path("libcudart")
        assert path is not None, "libcudart is not loaded"
        self.lib = ctypes.CDLL(path)
        self.fn = {}
        for name, (res, args) in self.SIGNATURES.items():
            f = getattr(self.lib, name)
            f.restype, f.argtypes = res, args
            self.fn[name] = f

    def check(self, code):
        if code != 0:
            raise RuntimeError(f"CUDART error: {self.fn['cudaGetErrorString'](code).decode()}")

    def malloc(self, n):
        p = ctypes.c_void_p()
        self.check(self.fn["cudaMalloc"](ctypes.byref(p), n))
        return p

    def free(self, p):
        self.check(self.fn["cudaFree"](p))

    def memset(self, p, v, n):
        self.check(self.fn["cudaMemset"](p, v, n))

    def memcpy(self, dst, src, n):
        self.check(self.fn["cudaMemcpy"](dst, src, n, 4))       # cudaMemcpyDefault

    def get_handle(self, p):
        h = IpcHandle()
        self.check(self.fn["cudaIpcGetMemHandle"](ctypes.byref(h), p))
        return h

    def open_handle(self, h):
        p = ctypes.c_void_p()
        self.check(self.fn["cudaIpcOpenMemHandle"](ctypes.byref(p), h, 1))
        return p

    def close_handle(self, p):
        self.check(self.fn["cudaIpcCloseMemHandle"](p))


def create_shared_buffer(g, size):
    """cudaMalloc, get the handle, all-gather its bytes, open every peer's."""
    lib = RTWrapper()
    mine = lib.malloc(size)
    lib.memset(mine, g.rank + 1, size)
    blobs = g.all_gather_object(bytes(lib.get_handle(mine)), tag="ipc handles")
    ptrs = [mine.value if i == g.rank else lib.open_handle(IpcHandle.from_buffer_copy(b)).value
            for i, b in enumerate(blobs)]
    g.barrier(tag="opened")
    return ptrs


def free_shared_buffer(g, ptrs):
    lib = RTWrapper()
    for i, p in enumerate(ptrs):
        if i != g.rank:
            lib.close_handle(ctypes.c_void_p(p))
    g.barrier(tag="closed")
    lib.free(ctypes.c_void_p(ptrs[g.rank]))


# ---- finding and loading ------------------------------------------------------------------------

def test_libcudart_is_in_proc_self_maps_as_a_private_file():
    # A CUDA build of torch loads the wheel's real libcudart at import, so that one may come
    # first in the maps (a hosted rank's CDLL of it is served too: test_torch_cuda_build.py).
    path = cudart.mapped_path()
    assert path in loaded_library_paths("libcudart")
    if torch.version.cuda is None:
        assert loaded_library_path("libcudart") == path
    name = os.path.basename(path)
    assert name.rpartition(".so")[0] == "libcudart"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


def test_cdll_serves_libcudart_only_to_hosted_ranks():
    path = cudart.mapped_path()
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def inside():
        for lib in (ctypes.CDLL(path), ctypes.cdll.LoadLibrary(path), ctypes.CDLL("libcudart.so.13")):
            assert isinstance(lib, fakelib.FakeLibrary)
        libc = ctypes.CDLL("libc.so.6")                   # everything else loads for real
        assert not isinstance(libc, fakelib.FakeLibrary) and libc.getpid() == os.getpid()
        with pytest.raises(AttributeError, match="undefined symbol: cudaNoSuchCall"):
            ctypes.CDLL(path).cudaNoSuchCall
        with pytest.raises(OSError):
            ctypes.CDLL("/nonexistent/libcudart.so.13")

    solo(r, inside)
    # Outside any rank (the launcher's threads, a test runner or Ray sharing the interpreter)
    # CDLL is the real loader: the stand-in file is no ELF library; a libcudart.so.13 that
    # loads is a real one (the cuda-toolkit wheel's), never the simulated library.
    with pytest.raises(OSError):
        ctypes.CDLL(path)
    try:
        assert not isinstance(ctypes.CDLL("libcudart.so.13"), fakelib.FakeLibrary)
    except OSError:
        pass


# ---- the seed ----------------------------------------------------------------------------------

def test_two_gb200_trays_fail_with_the_wrappers_invalid_resource_handle():
    """seeds/000: FlashInfer's create_shared_buffer across two GB200 nodes."""
    fabric, rs = ranks("gb200-nvl72:2", [(0, 0), (0, 1), (1, 0), (1, 1)])
    outs = run(rs, lambda g: create_shared_buffer(g, 2 << 20))
    for o, r in zip(outs, rs):
        assert isinstance(o.error, RuntimeError)
        assert str(o.error) == "CUDART error: invalid resource handle"
        e = r.events.first_error
        assert (e.api, e.code) == ("cudaIpcOpenMemHandle", 400)
        assert "open_handle" in e.site and "test_cudart_ctypes.py" in e.site


def test_the_raw_open_across_trays_returns_400():
    _, rs = ranks("gb200-nvl72:2", [(0, 0), (1, 0)])

    def program(g):
        lib = RTWrapper()
        mine = lib.malloc(1 << 20)
        blobs = g.all_gather_object(bytes(lib.get_handle(mine)), tag="handles")
        out = ctypes.c_void_p()
        code = lib.fn["cudaIpcOpenMemHandle"](ctypes.byref(out), IpcHandle.from_buffer_copy(blobs[1 - g.rank]), 1)
        g.barrier(tag="tried")
        lib.free(mine)
        return code, out.value
    assert [o.unwrap() for o in run(rs, program)] == [(400, None), (400, None)]


def test_one_gb200_tray_succeeds_and_closes_clean():
    fabric, rs = ranks("gb200-nvl72:1", [(0, 0), (0, 1), (0, 2), (0, 3)])

    def program(g):
        ptrs = create_shared_buffer(g, 1 << 16)
        lib = RTWrapper()
        seen = []
        for p in ptrs:
            buf = ctypes.create_string_buffer(4)
            lib.memcpy(buf, ctypes.c_void_p(p), 4)       # cudaMemcpyDefault: device -> host
            seen.append(buf.raw)
        free_shared_buffer(g, ptrs)
        return seen

    for o in run(rs, program, seed=4):
        assert o.unwrap() == [bytes([i + 1]) * 4 for i in range(4)]
    for r in rs:
        assert r.driver.ledger.summary() == {} and r.events.first_error is None
    assert not fabric.allocs


@pytest.mark.parametrize("spec,expect", [("hgx-h100-8", 1), ("rtx4090-8", 0), ("l40s-8-pcie", 0)])
def test_peer_access_query_through_byref(spec, expect):
    _, (r,) = ranks(spec, [(0, 0)])

    def program():
        lib = RTWrapper()
        can = ctypes.c_int(-1)
        lib.check(lib.fn["cudaDeviceCanAccessPeer"](ctypes.byref(can), 0, 1))
        dev = ctypes.c_int(-1)
        lib.check(lib.fn["cudaSetDevice"](3))
        lib.check(lib.fn["cudaGetDevice"](ctypes.byref(dev)))
        return can.value, dev.value
    assert solo(r, program) == (expect, 3)


# ---- the C ABI as ctypes gives it ------------------------------------------------------------------

def test_error_strings_are_the_runtimes():
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])
    texts = solo(r, lambda: [RTWrapper().fn["cudaGetErrorString"](c) for c in (0, 1, 201, 217, 400, 700)])
    assert texts == [b"no error", b"invalid argument", b"invalid device context",
                     b"peer access is not supported between these two devices",
                     b"invalid resource handle", b"an illegal memory access was encountered"]


def test_argtypes_are_enforced_like_ctypes():
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])
    libc = ctypes.CDLL("libc.so.6")
    real = libc.memset
    real.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    with pytest.raises(ctypes.ArgumentError) as theirs:
        real(5, 1)

    def program():
        f = RTWrapper().fn["cudaMalloc"]
        with pytest.raises(ctypes.ArgumentError) as ours:
            f(5, 1)
        with pytest.raises(TypeError, match="takes at least 2 arguments"):
            f(ctypes.byref(ctypes.c_void_p()))
        return str(ours.value)
    assert solo(r, program) == str(theirs.value)


def test_default_restype_and_unsimulated_symbols():
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def program():
        lib = ctypes.CDLL(cudart.mapped_path())
        raw = lib.cudaGetErrorString(400)        # no restype: ctypes gives a C int
        null_out = lib.cudaMalloc(None, 16)      # NULL out-pointer
        with pytest.raises(NotImplementedError, match=r"libcudart\.cudaDeviceGetLimit is not simulated"):
            lib.cudaDeviceGetLimit(None, 0)
        return raw, null_out
    raw, null_out = solo(r, program)
    assert isinstance(raw, int) and null_out == 1


def test_a_device_reset_through_ctypes_frees_what_the_wrapper_allocated():
    """SGLang's and vLLM's P2P checks call `cudaDeviceReset` through their ctypes wrapper
    after each pair: it answers cudaSuccess and the allocation is gone."""
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def program():
        lib = RTWrapper()
        p = lib.malloc(1024)
        reset = ctypes.CDLL(cudart.mapped_path()).cudaDeviceReset()
        return reset, lib.fn["cudaFree"](p)
    assert solo(r, program) == (0, 1)            # cudaSuccess, then cudaErrorInvalidValue


def test_ctypes_and_cuda_python_share_one_runtime():
    _, (r,) = ranks("gb200-nvl72:1", [(0, 2)])

    def program():
        from cuda.bindings import runtime as rt
        lib = RTWrapper()
        p = lib.malloc(4096)
        err, attrs = rt.cudaPointerGetAttributes(p.value)
        bad = lib.fn["cudaFree"](ctypes.c_void_p(p.value + 8))        # not an allocation base
        last = rt.cudaGetLastError()[0]
        again = rt.cudaGetLastError()[0]
        lib.free(p)
        return attrs.device, bad, last, again
    dev, bad, last, again = solo(r, program)
    assert dev == 2 and bad == 1
    assert (int(last), int(again)) == (1, 0)      # sticky error read and cleared


def test_a_spawned_worker_process_is_hosted_too():
    """A process the program starts (multiprocessing 'spawn') installs the surfaces at start
    and is bound process-wide: libcudart is in its maps, NVML and torch.cuda answer."""
    import multiprocessing as mp

    import sim_ranks
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=sim_ranks.spawned_worker, args=("gb200-nvl72:2", 1, 2, q))
    p.start()
    try:
        got = q.get(timeout=120)
    finally:
        p.join(timeout=60)
    assert p.exitcode == 0
    # row L9: a process opening its own handle gets "invalid device context" (201)
    assert got == ("libcudart.so.13", 201, "invalid device context", 4, True, 2)


def test_async_set_and_copy_on_the_default_stream_through_ctypes():
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def body():
        lib = ctypes.CDLL(cudart.mapped_path())
        lib.cudaMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
        lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_int, ctypes.c_void_p]
        w = RTWrapper()
        p = w.malloc(16)
        w.check(lib.cudaMemsetAsync(p, 5, 16, None))
        buf = (ctypes.c_ubyte * 16)()
        w.check(lib.cudaMemcpyAsync(ctypes.addressof(buf), p, 16, 2, None))   # DeviceToHost
        w.free(p)
        return list(buf)

    assert solo(r, body) == [5] * 16
