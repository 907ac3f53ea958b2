"""The CUDA conformance rig's machinery on CPU: worker processes, proxied Driver calls,
machine matching, UNKNOWN ground truth, and real fd passing with SCM_RIGHTS. Each worker
runs a SimDriver here (tests/device/rig_fake.py) in place of a CudaDriver."""

from __future__ import annotations

import os
import threading

import pytest

from commsim.driver import alloc_prop, check
from commsim.topology.presets import build
from device import fd_channel
from commsim.devicecheck.rig import CaseNotRunnable, CudaRig
from gpu_required import GPU_MISSING

FAKE = "rig_fake:sim_driver"


@pytest.fixture(scope="module")
def rig():
    r = CudaRig(build("hgx-h100-8"), [(0, 0), (0, 1)], driver_factory=FAKE)
    yield r
    r.close()


def test_proxied_calls_and_bytes(rig):
    d = rig[0]
    p = check("cudaMalloc", d.cudaMalloc(4096))
    assert check("write", rig.write(0, p, b"commsim" * 8)) is None
    assert check("read", rig.read(0, p, 14)) == b"commsimcommsim"
    # a struct argument crosses the process boundary (describe / rebuild)
    assert check("gran", d.cuMemGetAllocationGranularity(alloc_prop(0, 1), 0)) == 2 << 20
    check("cudaFree", d.cudaFree(p))
    assert rig.pid(0) != os.getpid() and rig.pid(0) != rig.pid(1)


def test_run_ranks_interleaves_the_processes(rig):
    outs = rig.run_ranks(lambda r: check("dev", rig[r].cudaGetDevice()), seed=3)
    assert [o.unwrap() for o in outs] == [0, 1]


def test_simulator_ground_truth_is_unknown(rig):
    assert rig.held(0) == {} and rig.held(1) == {"ipc_mapping": 3}
    assert rig.held(0)["vmm_mapping"] == 1 and "multicast_binding" not in rig.held(0)
    assert rig.flag_count("L15") == 2 and rig.live_allocs() == 0 and rig.flagged("L15", 1)
    rig.assert_clean()
    with pytest.raises(pytest.skip.Exception, match="ledger is simulator ground truth"):
        rig.ledger(0)


def test_a_different_machine_is_not_the_case():
    with pytest.raises(CaseNotRunnable, match="not rtx4090-8.*p2p to GPU 1: case False, here True"):
        CudaRig(build("rtx4090-8"), [(0, 0), (0, 1)], driver_factory=FAKE)


def test_multi_host_cases_are_not_runnable_here():
    with pytest.raises(CaseNotRunnable, match="2 hosts"):
        CudaRig(build("gb200-nvl72:2"), [(0, 0), (1, 0)], driver_factory=FAKE)


@pytest.mark.skipif(not GPU_MISSING, reason="a GPU is present")
def test_worker_without_gpu_reports_no_gpu_error():
    from device.errors import NoGpuError
    with pytest.raises(NoGpuError, match="libcuda|no CUDA device|CUDA cannot start"):
        CudaRig(build("hgx-h100-8"), [(0, 0)])


def test_fd_passing_with_scm_rights(tmp_path):
    path = str(tmp_path / "r.sock")
    listener = fd_channel.listen(path)
    r, w = os.pipe()
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(fd_channel.recv_fd(listener, timeout=10)))
    t.start()
    fd_channel.send_fd(path, w, timeout=10)
    t.join(10)
    listener.close()
    assert got and got[0] != w
    os.write(got[0], b"through SCM_RIGHTS")      # the received fd is the same pipe end
    assert os.read(r, 64) == b"through SCM_RIGHTS"
    for fd in (r, w, got[0]):
        os.close(fd)
