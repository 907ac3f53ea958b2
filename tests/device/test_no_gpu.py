"""Without a GPU every device entry point says what is missing, and nothing crashes on import."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_required import GPU_MISSING

ROOT = Path(__file__).resolve().parents[2]
no_gpu_only = pytest.mark.skipif(not GPU_MISSING, reason="a GPU is present: the no-GPU path is not taken")


@pytest.mark.parametrize("mod", ["device.driver", "device.build", "device.launch", "device.nvml",
                                 "device.handles", "device.host", "device.fd_channel",
                                 "commsim.probe.machine", "commsim.probe.scenario",
                                 "commsim.devicecheck.predict", "commsim.devicecheck.check",
                                 "commsim.devicecheck.rig", "commsim.devicecheck.rig_worker",
                                 "commsim.devicecheck.e2e", "commsim.commands.probe"])
def test_every_device_module_imports_without_a_gpu(mod):
    importlib.import_module(mod)


@no_gpu_only
def test_create_raises_no_gpu_error_naming_the_missing_piece():
    from commsim.errors import UserError
    from device.driver import CudaDriver
    from device.errors import NoGpuError
    with pytest.raises(NoGpuError) as ei:
        CudaDriver.create(0)
    assert isinstance(ei.value, UserError)
    msg = str(ei.value)
    assert msg == GPU_MISSING
    if "libcuda.so.1" in msg:   # this CI machine: no driver at all
        assert msg.startswith("no NVIDIA driver: libcuda.so.1 not found (cudaGetDeviceCount: ")


@no_gpu_only
def test_commsim_probe_exits_2_with_the_message(capsys, tmp_path):
    from commsim.cli import main
    out = tmp_path / "probe.toml"
    assert main(["probe", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("commsim: error: ") and GPU_MISSING in err
    assert not out.exists()


def test_commsim_probe_refuses_an_existing_output(capsys, tmp_path):
    from commsim.cli import main
    out = tmp_path / "probe.toml"
    out.write_text("keep me")
    assert main(["probe", "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err and out.read_text() == "keep me"


@no_gpu_only
def test_device_check_module_reports_no_gpu(capsys):
    from commsim.devicecheck.check import main
    assert main([]) == 2
    assert capsys.readouterr().err.strip() == f"device check: cannot run: {GPU_MISSING}"


def test_device_check_script_is_valid_bash():
    script = ROOT / "scripts" / "device_check.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_device_end_to_end_uses_the_simulators_default_order():
    """The device e2e run (and device_check.sh, which runs it without --order) tries the
    backends in the simulator's default order, multicast and symm included."""
    from commsim.devicecheck import e2e
    from commsim.policy import Policy
    assert e2e.default_order() == tuple(Policy().order)
    assert {"multicast", "symm"} <= set(e2e.default_order())
    script = (ROOT / "scripts" / "device_check.sh").read_text()
    line = next(ln for ln in script.splitlines() if "commsim.devicecheck.e2e" in ln and "torch.distributed.run" in ln)
    assert "--order" not in line


@no_gpu_only
def test_conformance_under_cuda_skips_with_the_reason():
    env = dict(os.environ, COMMSIM_DEVICE="cuda")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "tests/conformance/test_rules.py", "-k", "L1 or L8"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert " passed" not in p.stdout and "skipped" in p.stdout
    assert "COMMSIM_DEVICE=cuda but " + GPU_MISSING.split(" (")[0] in p.stdout
