"""The pytest plugin: a downstream test file runs as ranks of a simulated machine; a failing
run fails the test with the verdict as its message."""

DOWNSTREAM = '''
import ctypes
import socket

import pytest
import torch.distributed as dist


class Handle(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def open_peers():
    dist.init_process_group("nccl")
    with open("/proc/self/maps") as f:
        lib = ctypes.CDLL(next(ln.split()[-1] for ln in f if "libcudart" in ln))
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    buf, h = ctypes.c_void_p(), Handle()
    assert lib.cudaMalloc(ctypes.byref(buf), 1024) == 0
    assert lib.cudaIpcGetMemHandle(ctypes.byref(h), buf) == 0
    handles = [None] * dist.get_world_size()
    dist.all_gather_object(handles, bytes(h))
    for peer, blob in enumerate(handles):
        if peer != dist.get_rank():
            p = ctypes.c_void_p()
            err = lib.cudaIpcOpenMemHandle(ctypes.byref(p), Handle.from_buffer_copy(blob), 1)
            if err:
                raise RuntimeError("CUDART error: " + lib.cudaGetErrorString(err).decode())
            assert lib.cudaIpcCloseMemHandle(p) == 0
    dist.barrier()
    assert lib.cudaFree(buf) == 0
    dist.destroy_process_group()


@pytest.mark.commsim(ranks=RANKS)
def test_open_peers(commsim_rank):
    assert socket.gethostname() == commsim_rank.host
    open_peers()
'''


def _file(pytester, ranks=4):
    pytester.makepyfile(test_downstream=DOWNSTREAM.replace("RANKS", str(ranks)))


def test_plugin_passes_on_one_tray(pytester):
    _file(pytester)
    r = pytester.runpytest("--commsim-machine", "gb200-nvl72:1", "-p", "no:xdist")
    r.assert_outcomes(passed=1)


def test_plugin_fails_across_trays_with_the_verdict(pytester):
    _file(pytester)
    r = pytester.runpytest("--commsim-machine", "gb200-nvl72:2", "-p", "no:xdist")
    r.assert_outcomes(failed=1)
    text = r.stdout.str()
    assert "commsim exec: FAIL: 4 rank(s) on gb200-nvl72:2" in text
    assert "RuntimeError: CUDART error: invalid resource handle" in text
    assert "replay: commsim exec" in text
