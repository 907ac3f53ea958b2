"""A test module that imports the installed FlashInfer's communication package at its top
(its `comm/mnnvl.py` takes `from cuda.bindings import driver` and `import pynvml` there), and
a program of the same check: `python flashinfer_at_top.py`. The check is FlashInfer's own
MNNVL probe, `is_mnnvl_fabric_supported` (a driver attribute, then NVML's fabric state), which
holds on a GB200 tray and not on an HGX box; the real binding on a machine without a driver
fails it with FlashInfer's CUDA error."""

import pytest
import torch

import flashinfer.comm as comm


def fabric() -> None:
    torch.cuda.set_device(0)
    assert comm.mnnvl.is_mnnvl_fabric_supported(0), "no MNNVL fabric"


@pytest.mark.commsim(ranks=2, visible="one")
def test_fabric():
    fabric()


if __name__ == "__main__":
    fabric()
