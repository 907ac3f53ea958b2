"""Tests that need a real GPU (skipped elsewhere with what is missing, tests/device/gpu_required.py).

The conformance suite against CudaDriver, the end-to-end communicator under torchrun, the
device check and `commsim probe` all run as their own processes, as they would by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpu_required import gpu_count, requires_gpu, requires_gpus

ROOT = Path(__file__).resolve().parents[2]


@requires_gpu
def test_driver_basics_and_a_kernel():
    from commsim.driver import check
    from commsim.kernels import collectives as K, workspace as W
    from device.driver import CudaDriver

    d = CudaDriver.create(0)
    cap = 1 << 20
    ws = check("cudaMalloc", d.cudaMalloc(W.workspace_bytes(cap)))
    try:
        check("cudaMemset", d.cudaMemset(ws, 0, W.FLAGS_BYTES))
        h = check("cudaIpcGetMemHandle", d.cudaIpcGetMemHandle(ws))
        assert isinstance(h, bytes) and len(h) == 64
        x = np.arange(1000, dtype=np.float32)
        check("htod", d.memcpy_htod(ws + W.DATA, x))
        check("one-shot", d.launch_kernel(K.one_shot_all_reduce, [ws], 0, x.size, "float32", cap, 1))
        got = check("dtoh", d.memcpy_dtoh(ws + W.DATA + cap, x.nbytes)).view(np.float32)
        assert np.array_equal(got, x)                  # a reduction over one rank
        tmp = check("cudaMalloc", d.cudaMalloc(64))
        check("read_bytes", d.launch_kernel("read_bytes", ws + W.DATA, tmp, 64))
        assert check("dtoh", d.memcpy_dtoh(tmp, 64)).tobytes() == x[:16].tobytes()
        check("cudaFree", d.cudaFree(tmp))
    finally:
        d.cudaFree(ws)


@requires_gpu
def test_commsim_probe_writes_a_scenario_that_loads(tmp_path):
    out = tmp_path / "probe.toml"
    p = subprocess.run([sys.executable, "-m", "commsim.cli", "probe", "-o", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    from commsim.scenario import schema
    s = schema.load(out)
    assert len(s.cluster.hosts[0].gpus) == gpu_count()


@requires_gpu
def test_conformance_suite_on_cuda():
    env = dict(os.environ, COMMSIM_DEVICE="cuda")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "tests/conformance"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stdout[-8000:] + p.stderr[-2000:]


@requires_gpu
def test_device_check():
    p = subprocess.run([sys.executable, "-m", "commsim.devicecheck"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-8000:] + p.stderr[-2000:]


@requires_gpus(2)
def test_end_to_end_communicator_under_torchrun():
    n = min(gpu_count(), 8)
    n -= n % 2
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={n}", "-m", "commsim.devicecheck.e2e"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-8000:] + p.stderr[-2000:]
    assert "0 failed" in p.stdout
