"""The one skip helper of tests/device: GPU tests are skipped with what is missing here."""

from __future__ import annotations

import pytest

from device.driver import unavailable_reason

GPU_MISSING = unavailable_reason()            # "" on a machine with a usable GPU
requires_gpu = pytest.mark.skipif(bool(GPU_MISSING), reason=f"needs an NVIDIA GPU: {GPU_MISSING}")


def gpu_count() -> int:
    if GPU_MISSING:
        return 0
    from cuda.bindings import runtime as cudart
    err, n = cudart.cudaGetDeviceCount()
    return int(n) if int(err) == 0 else 0


def requires_gpus(n: int) -> pytest.MarkDecorator:
    have = gpu_count()
    why = GPU_MISSING or f"{have} GPU(s) visible"
    return pytest.mark.skipif(have < n, reason=f"needs {n} NVIDIA GPUs: {why}")
