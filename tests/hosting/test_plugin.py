"""The pytest plugin: a downstream test file runs as ranks of a simulated machine; a failing
run fails the test with the verdict as its message."""

import importlib.util
import sys
from pathlib import Path

import pytest

from commsim.hosting.install.registry import install_all
from commsim.hosting.surfaces import table
from commsim.launch.cause import root_cause_line
from commsim.launch.verdict import STALE_MODULES
from hosting_helpers import PROGRAMS, hosted

# pytester's in-process runs drop the modules they imported; the surface modules (what they
# patch outlives the run: ctypes.CDLL) are imported here so that every run shares them.
_SURFACES = [importlib.import_module(m) for m in table.MODULES]
# Likewise torch's modules that define a torch library at import (symmetric memory and the
# functional collectives under it), which the hosted FlashInfer runs below import: pytester
# drops the module after a test but not its library, and the next import in this worker
# would define the library twice.
_TORCH_LIBRARIES = importlib.import_module("torch.distributed._symmetric_memory")


DOWNSTREAM = '''
import ctypes
import socket

import pytest
import torch.distributed as dist


class Handle(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def open_peers():
    dist.init_process_group("cpu:gloo,cuda:nccl")     # the handles travel by gloo
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


@pytest.fixture(autouse=True)
def hosting_installed_before_the_snapshot():
    """pytester's in-process run snapshots sys.modules and sys.meta_path and puts them back
    afterwards. Hosting installed for the first time inside it would be reverted behind the
    registry's back (its stand-ins and finders gone, its flags still saying installed), and
    every later hosted test in this worker would meet the real cuda.bindings and no mpi4py.
    Installed first, the snapshot holds the stand-ins and the inner install is a no-op."""
    install_all(table.MODULES)


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


# ---- collection is hosted: module-level imports of hosted modules -----------------------------

def _program_as_test(pytester, program: str) -> Path:
    """tests/hosting/programs/<program>.py as the test module test_<program>.py."""
    path = pytester.path / f"test_{program}.py"
    path.write_text((PROGRAMS / f"{program}.py").read_text())
    return path


def _failed_line(r) -> str:
    return next(ln for ln in r.outlines if ln.startswith("FAILED "))


def test_module_level_driver_gives_execs_verdicts(pytester, monkeypatch):
    """`from cuda.bindings import driver` at a test module's top, collected before any rank
    runs: the inproc ranks reach the simulated driver (they failed every rank with the real
    binding's DynamicLibNotFoundError), and each test's verdict is the program's under
    `commsim exec`: a pass, and the same root cause line for the failing call."""
    monkeypatch.setenv("CI", "true")
    path = _program_as_test(pytester, "driver_at_top")
    by_exec = {check: hosted(path, "gb200-nvl72:1", check, nproc_per_host=2, visible="one")[0]
               for check in ("sees", "past")}
    assert by_exec["sees"].ok and not by_exec["past"].ok, by_exec["past"].format()
    want = ("FAILED test_driver_at_top.py::test_past - Failed: commsim: "
            + root_cause_line(by_exec["past"]))
    assert "cuDeviceGet -> CUDA_ERROR_INVALID_DEVICE (101) at test_driver_at_top.py:" in want
    r = pytester.runpytest("--commsim-machine", "gb200-nvl72:1", "-p", "no:xdist")
    r.assert_outcomes(passed=1, failed=1)
    assert _failed_line(r) == want
    # procs mode collects in hosted rank processes: test_function_taken_at_top_... checks its
    # root cause line (the CI budget keeps one procs run of these; the peers extra runs both
    # modes on FlashInfer's module below)


FUNCTION_AT_TOP = '''
import pytest
from cuda.bindings.driver import cuDeviceGet, cuInit


@pytest.mark.commsim(machine="gb200-nvl72:1", ranks=1)
def test_past_the_host():
    assert cuInit(0)[0] == 0
    err, _ = cuDeviceGet(4)
    assert err == 0, err.name
'''


def test_function_taken_at_top_runs_in_procs_and_says_so(pytester, monkeypatch):
    """A function taken by name at collection (`from cuda.bindings.driver import cuInit`) is
    the real one whatever is installed later: the inproc test runs in procs mode, where the
    rank's interpreter is hosted before it collects, and the verdict says why."""
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_by_name=FUNCTION_AT_TOP)
    r = pytester.runpytest("-p", "no:xdist")
    r.assert_outcomes(failed=1)
    text = r.stdout.str()
    assert _failed_line(r).startswith(
        "FAILED test_by_name.py::test_past_the_host - Failed: commsim: cuda-error on rank 0 "
        "(gb200-nvl72-tray00, GPU 0): cuDeviceGet -> CUDA_ERROR_INVALID_DEVICE (101)"), text
    assert (f"mode procs, seed 0" in text
            and f"run in procs mode, not inproc: {STALE_MODULES}: test_by_name.cuDeviceGet is "
                "the real cuda.bindings.driver.cuDeviceGet; test_by_name.cuInit is the real "
                "cuda.bindings.driver.cuInit" in text), text


def test_flashinfer_comm_at_top_gives_execs_verdicts(pytester, monkeypatch):
    """The installed FlashInfer's `import flashinfer.comm` at a test module's top: its MNNVL
    probe answers from the simulated machine in both modes, as under `commsim exec` (a GB200
    tray has the fabric, an HGX box does not)."""
    if importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer-python is not installed (`make test` installs it)")
    monkeypatch.setenv("CI", "true")
    path = _program_as_test(pytester, "flashinfer_at_top")
    for machine, mode in (("gb200-nvl72:1", "inproc"), ("hgx-h100-8", "inproc"),
                          ("hgx-h100-8", "procs")):
        v = hosted(path, machine, nproc_per_host=2, visible="one")[0]
        # In a process of its own: an in-process pytester run drops the modules it imported
        # (torch.distributed's among them), and importing those again here fails.
        r = pytester.runpytest_subprocess("--commsim-machine", machine, "--commsim-mode", mode,
                                          "-p", "no:xdist")
        if v.ok:
            r.assert_outcomes(passed=1)
        else:
            r.assert_outcomes(failed=1)
            assert _failed_line(r) == ("FAILED test_flashinfer_at_top.py::test_fabric - Failed: "
                                       "commsim: " + root_cause_line(v))
        assert v.ok == (machine == "gb200-nvl72:1"), v.format()


def test_stale_references_follow_modules_functions_and_classes(monkeypatch):
    """What a test module reaches through its globals: a module held by a package it holds,
    the module of a function it took; the stand-in and commsim's own modules are no finding."""
    import types

    import cuda.bindings
    from commsim.hosting.install.registry import install_all
    from commsim.hosting.install.stale import stale_references
    from commsim.hosting.surfaces.cuda import bindings as cuda_bindings
    install_all(table.MODULES)
    lib, helper, test = (types.ModuleType(n) for n in ("fake_lib", "fake_lib.helper", "test_x"))
    helper.driver = cuda_bindings._real_driver
    exec("def probe(): return driver", helper.__dict__)
    lib.helper = helper
    for m in (lib, helper):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    test.lib, test.runtime = lib, cuda.bindings.runtime
    assert stale_references([test]) == ["fake_lib.helper.driver is the real cuda.bindings.driver"]
    test.lib, test.probe = None, helper.probe        # reached through the function's module
    test.cuInit = cuda_bindings._real_driver.cuInit
    assert stale_references([test]) == [
        "fake_lib.helper.driver is the real cuda.bindings.driver",
        "test_x.cuInit is the real cuda.bindings.driver.cuInit"]


SOCKET_PAIR = '''
import runpy

import pytest


@pytest.mark.commsim(machine="hgx-h100-8", ranks=2)
def test_pair():
    runpy.run_path(PROGRAM)
'''


def test_a_blocking_socket_between_ranks_sends_the_test_to_procs_as_exec_does(pytester):
    """FlashInfer's fd exchange (an AF_UNIX socket between ranks) cannot run between in-process
    ranks: the inproc test (tests/hosting/programs/unix_socket_pair.py run as a test) is run
    again as processes, its pytest node, and passes (rank 0 received rank 1's byte: an empty
    read fails it), as `commsim exec` runs that program (tests/hosting/test_sockets.py)."""
    pytester.makepyfile(test_pair=SOCKET_PAIR.replace(
        "PROGRAM", repr(str(PROGRAMS / "unix_socket_pair.py"))))
    r = pytester.runpytest("-s", "-p", "no:xdist")
    r.assert_outcomes(passed=1)
    text = r.stdout.str()
    assert "blocking sockets between ranks need real processes; running again in procs mode" in text
