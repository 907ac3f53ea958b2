"""The verdict names the torch its ranks ran on, read from the installed torch/version.py
without importing torch."""

from __future__ import annotations

import pytest

from commsim.launch import torch_build as tb


@pytest.mark.parametrize("text, words", [
    ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n",
     "torch 2.13.0+cpu (CPU build)"),
    ("__version__ = '2.14.0'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n",
     "torch 2.14.0 (CUDA 13.0 build)"),
    ("__version__ = '2.9.0+rocm6.4'\ncuda = None\nhip = '6.4.43482'\n",
     "torch 2.9.0+rocm6.4 (ROCm/HIP 6.4.43482 build)"),
])
def test_version_file_literals_name_the_build(tmp_path, text, words):
    f = tmp_path / "version.py"
    f.write_text("from typing import Optional\n" + text)
    assert tb.describe(tb.version_fields(str(f))) == words


def test_installed_torch_is_named_as_torch_itself_reports_it():
    torch = pytest.importorskip("torch")
    kind = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    assert tb.torch_build() == f"torch {torch.__version__} ({kind})"
