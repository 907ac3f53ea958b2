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

import pytest

from commsim.hosting.install.registry import install_all
from commsim.hosting.surfaces.table import MODULES


@pytest.fixture(autouse=True)
def hosting_installed_before_the_snapshot():
    """pytester's in-process run snapshots sys.modules and sys.meta_path and puts them back
    afterwards. Hosting installed for the first time inside it would be reverted behind the
    registry's back (its stand-ins and finders gone, its flags still saying installed), and
    every later hosted test in this worker would meet the real cuda.bindings and no mpi4py.
    Installed first, the snapshot holds the stand-ins and the inner install is a no-op."""
    install_all(MODULES)


def _file(pytester, ranks=4):
    pytester.makepyfile(test_downstream=DOWNSTREAM.replace("RANKS", str(ranks)))


def test_plugin_passes_on_one_tray(pytester):
    _file(pytester)
    r = pytester.runpytest("--commsim-machine", "gb200-nvl72:1", "-p", "no:xdist")
    r.assert_outcomes(passed=1)


def test_plugin_fails_across_trays_with_the_verdict(pytester, monkeypatch):
    """The summary line leads with the root cause (CI shows it whole: pytest trims it to the
    terminal only off CI); the replay line names the test node, and running it fails the
    same way."""
    monkeypatch.setenv("CI", "true")
    _file(pytester)
    r = pytester.runpytest("--commsim-machine", "gb200-nvl72:2", "-p", "no:xdist")
    r.assert_outcomes(failed=1)
    text = r.stdout.str()
    assert "commsim exec: FAIL: 4 rank(s) on gb200-nvl72:2" in text
    assert "RuntimeError: CUDART error: invalid resource handle" in text
    summary = next(ln for ln in r.outlines if ln.startswith("FAILED "))
    assert summary.startswith(
        "FAILED test_downstream.py::test_open_peers - Failed: commsim: ipc-across-hosts on rank "
        "1 (gb200-nvl72-tray00, GPU 1): cudaIpcOpenMemHandle -> cudaErrorInvalidResourceHandle "
        "(400) at test_downstream.py:"), summary
    assert "legacy IPC handles are host-local (row L8" in summary
    replay = next(ln for ln in r.outlines if ln.startswith("replay: "))
    assert replay == ("replay: pytest test_downstream.py::test_open_peers --commsim-machine "
                      "gb200-nvl72:2 --commsim-mode inproc --commsim-seed 0")
    again = pytester.runpytest(*replay.split()[2:], "-p", "no:xdist")
    again.assert_outcomes(failed=1)
    assert next(ln for ln in again.outlines if ln.startswith("FAILED ")) == summary
