"""TorchDistGroup (commsim/group/torch_dist.py) from the torchrun environment
(ProcessWorld.from_env, the path of the device end-to-end run) in two real CPU processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_group_and_communicator_over_torch_distributed():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=2", str(HERE / "torch_dist_group_script.py")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "torch group ok" in p.stdout
