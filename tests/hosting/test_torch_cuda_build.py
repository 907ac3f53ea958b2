"""A CUDA build of torch on a machine without a driver, hosted: torch._C's compiled CUDA and
NCCL calls answer for the simulated machine (torch/compiled.py), the wheel's own libcudart is
served through ctypes, and procs mode's default backend is gloo. In the CPU build the
compiled calls do not exist and stay absent; the CUDA-build tests skip there."""

from __future__ import annotations

import ctypes

import pytest
import torch

from commsim.hosting.install import fakelib
from commsim.hosting.surfaces.torch import compiled
from hosting_helpers import PROGRAMS, hosted
from sim_ranks import module_surfaces, ranks, run  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")
CUDA_BUILD = torch.version.cuda is not None
cuda_build_only = pytest.mark.skipif(not CUDA_BUILD, reason="torch is a CPU build "
                                     "(torch.version.cuda is None): no torch._C._cuda_* calls")


def test_nccl_version_is_packed_as_torch_unpacks_it():
    v = compiled.nccl_version_packed(22703)
    assert (v >> 32, (v >> 16) & 65535, v & 65535) == (2, 27, 3)


@pytest.mark.skipif(CUDA_BUILD, reason="torch is a CUDA build: the CPU build's absence is not testable")
def test_cpu_build_gains_no_compiled_names_in_a_rank():
    _, rs = ranks("hgx-h100-8", [(0, 0)])

    def program(g):
        return hasattr(torch._C, "_cuda_getDeviceCount"), torch.cuda._is_compiled()
    assert run(rs, program)[0].unwrap() == (False, False)


@cuda_build_only
def test_compiled_calls_answer_for_the_simulated_machine():
    _, rs = ranks("hgx-h100-8", [(0, 0), (0, 5)])

    def program(g):
        c = torch._C
        c._cuda_setDevice(1 if g.rank else 0)
        t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        stats = c._cuda_memoryStats(c._cuda_getDevice())
        with pytest.raises(NotImplementedError, match=r"torch\._C\._nccl_all_reduce is not simulated"):
            torch.cuda.nccl.all_reduce([t])
        with pytest.raises(NotImplementedError, match=r"torch\._C\._cuda_getCurrentRawStream"):
            c._cuda_getCurrentRawStream(0)
        g_ = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_):
            capturing = c._cuda_isCurrentStreamCapturing()
        assert capturing and not c._cuda_isCurrentStreamCapturing()
        return (c._cuda_getDeviceCount(), c._cuda_getDevice(), torch.cuda.nccl.version(),
                c._cuda_canDeviceAccessPeer(0, 1), stats["allocated_bytes"]["all"]["current"] >= 1 << 20)
    nccl = tuple(rs[0].driver.cluster.versions.nccl)        # the run's, as libnccl.so.2 says
    for i, o in enumerate(run(rs, program)):
        assert o.unwrap() == (8, i, nccl, True, True)


@cuda_build_only
def test_outside_a_rank_the_compiled_calls_are_the_builds():
    # Tests run on machines without a driver (a GPU machine is not one this test is for).
    if torch._C._cuda_getDeviceCount() == 0:
        with pytest.raises(RuntimeError, match="no NVIDIA driver"):
            torch.zeros(1, device="cuda")
    else:
        pytest.skip("this machine has a CUDA device")


@cuda_build_only
def test_no_backend_on_a_cuda_build_is_served_by_gloo_in_procs_mode():
    # torch's default binds NCCL to the CUDA device; ProcessGroupNCCL finds no GPU here.
    v, res, _ = hosted(PROGRAMS / "default_backend.py", "hgx-h100-8", mode="procs", nproc_per_host=2)
    assert v.ok, v.format(verbose=True)
    assert {r: (d["backend"], d["sum"]) for r, d in res.items()} == {
        r: ("gloo", [3.0] * 4) for r in (0, 1)}
    assert all("served by gloo" in " ".join(p.notes) for p in v.ranks)


@cuda_build_only
def test_the_libcudart_torch_loaded_is_served_in_a_rank():
    # What vLLM's and FlashInfer's CudaRTLibrary open: the first libcudart in the maps, here
    # the wheel's real one (torch loads it at import), which would say "no driver".
    with open("/proc/self/maps") as maps:
        first = next(line for line in maps if "libcudart" in line)
    path = first[first.index("/"):].strip()
    _, rs = ranks("hgx-h100-8", [(0, 0)])

    def program(g):
        lib = ctypes.CDLL(path)
        n = ctypes.c_int()
        return isinstance(lib, fakelib.FakeLibrary), lib.cudaGetDeviceCount(ctypes.byref(n)), n.value
    assert run(rs, program)[0].unwrap() == (True, 0, 8)
