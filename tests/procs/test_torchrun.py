"""Process mode under torchrun (the launcher a serving stack uses), 2 CPU ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from commsim.sim import shm

ROOT = Path(__file__).resolve().parents[2]


def torchrun(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m", "commsim.procs.torchrun", *args],
                          env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)


def test_regression_under_torchrun_passes_with_default_policy():
    p = torchrun("scenarios/regressions/vllm-52778-graph-registration.toml", "--policy", "default",
                 "--timeout", "30")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "vllm-52778-graph-registration: ok (2 processes under torchrun" in p.stdout
    assert "16384 B bfloat16: fabric" in p.stdout
    prefix = p.stdout.split("shared-memory prefix ", 1)[1].split(")", 1)[0]
    assert prefix.startswith("commsim-") and not shm.segments(prefix)
