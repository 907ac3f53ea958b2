"""The installed flashinfer-python, unmodified, under `commsim exec` (the `peers` extra of
pyproject.toml pins it; `make peers` installs it). Skips when it is absent."""

from __future__ import annotations

import importlib.util

import pytest

from hosting_helpers import PROGRAMS, hosted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                                reason="flashinfer-python is not installed (make peers)")
PROGRAM = PROGRAMS / "flashinfer_comm.py"
NOT_SERVED = ("CompiledExtensionNotServed: commsim hosting: flashinfer JIT module 'trtllm_comm' "
              "is a compiled CUDA extension; served: none; not served: ")


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_import_flashinfer_comm_succeeds_in_every_rank(mode):
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "import", mode=mode, nproc_per_host=2)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok", "ok"], out


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_jit_module_load_is_the_named_error_and_starts_no_compiler(mode):
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "jit", mode=mode, nproc_per_host=2)
    assert v.ok, v.format() + out
    for r in (0, 1):
        assert res[r]["outcome"].startswith(NOT_SERVED), res[r]
        assert res[r]["compilers"] == []


def test_trtllm_workspace_on_one_host_stops_at_its_kernels_named():
    """Workspace creation runs its IPC set-up, then trtllm_lamport_initialize needs the
    trtllm_comm kernels: the named error on every rank, no compiler started."""
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "workspace", "trtllm", mode="procs",
                         nproc_per_host=2)
    assert v.ok, v.format() + out
    for r in (0, 1):
        assert res[r]["outcome"].startswith(NOT_SERVED), res[r]
        assert res[r]["compilers"] == []
